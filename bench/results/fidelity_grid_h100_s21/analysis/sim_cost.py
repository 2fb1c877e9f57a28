"""Issue 35, session 21: what the mixed steps' spread term costs the simulator: one 2,000-request
mixed-lengths run (17 req/s, the H100 6.7B mixed profile of this folder) with the term and without
it, twice each, wall seconds. Run from the repo root on a quiet machine:
    python bench/results/fidelity_grid_h100_s21/analysis/sim_cost.py"""
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from sims.runner import CostSpec, RunSpec, run_spec
from sims.workload import LengthSpec, WorkloadConfig

PROFILE = HERE.parent / "6.7b-mixed-seeds" / "profile_6.7b-mixed-seeds.json"
for mixed in ("off", "measured", "off", "measured"):
    spec = RunSpec(cost=CostSpec(model="deepseek-coder-6.7b", profile=str(PROFILE), hide_launch=True,
                                 power_cap=True, mixed_spread=mixed),
                   workload=WorkloadConfig(num_requests=2000, rate=17.0,
                                           input_len=LengthSpec.parse("lognormal:512:0.8"),
                                           output_len=LengthSpec.parse("lognormal:128:0.7"), seed=1))
    t = time.perf_counter()
    rep = run_spec(spec)
    dt = time.perf_counter() - t
    print(f"mixed_spread {mixed:9s}: {dt:6.2f} s wall, TPOT p50 {rep['tpot_ms']['p50']:.3f} ms, "
          f"TTFT p50 {rep['ttft_ms']['p50']:.2f} ms")
