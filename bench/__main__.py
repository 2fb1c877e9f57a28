"""`python -m bench` = `tidegate bench`."""
import sys

from bench.cli import main

sys.exit(main())
