"""`python -m sims`: the simulator speed benchmark (or `python -m sims sim-args...` for the CLI)."""
import sys

from sims.cli import COMMANDS, main
from sims.speed_bench import main as bench_main

if __name__ == "__main__":
    sys.exit(main() if len(sys.argv) > 1 and sys.argv[1] in COMMANDS else bench_main(sys.argv[1:]))
