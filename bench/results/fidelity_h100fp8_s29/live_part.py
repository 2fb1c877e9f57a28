"""Issue 35, session 29: one grid part's live steps for the decode reads beside it (`decode_*.py`): the step log's
rows, the steps rebuilt from the step and decision logs, and the part's cost model (session 21's
`prefill_bins.load`: the profile with the validate run's terms), in the same order."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench/results/fidelity_grid_h100_s21/analysis"))
from prefill_bins import load

from bench.simulator import fidelity_steps as fs

# the decode batches the grid's pass measures (`bench.engine.profile.step_shapes`); the others are the
# decode-bucket pass's points or between them
POW2 = frozenset(1 << k for k in range(9))


def load_part(part: Path):
    """(rows, steps, cost): the step log's rows that carry a step, its steps rebuilt, the part's cost model."""
    rows = [r for r in fs.read_steps(part / f"steps_{part.name}.jsonl.gz") if "mono" in r]
    steps, _bad, cost, _terms = load(part)
    return rows, steps, cost
