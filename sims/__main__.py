"""`python -m sims`: the simulator speed benchmark (or `python -m sims sim-args...` for the CLI)."""
import sys

from bench.simulator.speed import main as bench_main
from sims.cli import COMMANDS, main

if __name__ == "__main__":
    sys.exit(main() if len(sys.argv) > 1 and sys.argv[1] in COMMANDS else bench_main(sys.argv[1:]))
