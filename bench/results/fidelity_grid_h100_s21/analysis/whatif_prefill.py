"""What-if: the part's replay (grid-state model) with every step that carries prefill tokens
multiplied by F (decode-only steps as modelled): how much of the TPOT error the mixed steps'
under-charge explains.   python whatif_prefill.py PART F"""
import sys

from bench.simulator import validate as v
from bench.simulator import validate_replay as vr

part, F = sys.argv[1], float(sys.argv[2])
def step_time(self, d, p, ctx, prefill_chunks=None):
    f = self.factor if p > 0 else 1.0
    if prefill_chunks is not None:
        return f * self.inner.step_time(d, p, ctx, prefill_chunks=prefill_chunks)
    return f * self.inner.step_time(d, p, ctx)
v.ScaledCost.step_time = step_time
orig = vr.replay_session
vr.replay_session = lambda *a, **k: orig(*a, **{**k, "cost_scale": (lambda s, l: F)})
b = f"bench/results/fidelity_grid_h200_s20/{part}"
vr.main([f"{b}/validate_{part}.json", f"{b}/decisions_{part}.jsonl.gz", f"{b}/steps_{part}.jsonl.gz",
         "--profile", f"{b}/profile_{part}.json", "--cap-by-power", "--gateway-loop", "on", "--plan-lead", "live"])
