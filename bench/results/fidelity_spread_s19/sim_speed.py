"""Issue 35, session 19: what the unequal-contexts term costs the simulator. 3,000 requests through the
H100 6.7B mixed part's profile, mixed (lognormal 512 σ 0.8) or fixed (512) prompts, outputs lognormal
128 σ 0.7, without the term and at kappa 2.5: wall time and TPOT / TTFT P50.

    python sim_speed.py
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from sims.runner import CostSpec, RunSpec, run_spec
from sims.workload import LengthSpec, WorkloadConfig

PROFILE = Path(__file__).resolve().parents[1] / "fidelity_grid_h100_s18/6.7b-mixed/profile_6.7b-mixed.json"
for spread in ("off", 2.5):
    for inl in ("lognormal:512:0.8", "512"):
        spec = RunSpec(cost=CostSpec(model="deepseek-coder-6.7b", profile=str(PROFILE), decode_spread=spread,
                                     hide_launch=True),
                       workload=WorkloadConfig(num_requests=3000, rate=14.0, input_len=LengthSpec.parse(inl),
                                               output_len=LengthSpec.parse("lognormal:128:0.7"), seed=1))
        t0 = time.perf_counter()
        rep = run_spec(spec)
        print(f"decode_spread {spread!s:4s} prompts {inl:18s} wall {time.perf_counter() - t0:5.1f} s  "
              f"TPOT P50 {rep['tpot_ms']['p50']:.3f} ms  TTFT P50 {rep['ttft_ms']['p50']:.2f} ms")
