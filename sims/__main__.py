"""`python -m sims`: the simulator speed benchmark (or `python -m sims sim-args...` for the CLI).

The benchmark lives with every other measurement (`bench/simulator/speed.py`); it is reached by
name, as `tidegate` reaches its subcommands, so that the simulator package imports nothing of
bench/ (tests/test_import_rules.py)."""
import importlib
import sys

from sims.cli import COMMANDS, main

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        sys.exit(main())
    sys.exit(importlib.import_module("bench.simulator.speed").main(sys.argv[1:]))
