"""Issue 31, seventh session (simulated only, not in the code): the Slow arrival-quantile check
applied to Normal requests too (`arrival_quantile_from=1`) with quantile Q for Normal, over
workload seeds 0-29 at RATE (the sixth session's warmup.py with a monkeypatch). From the
repository root: `.venv/bin/python bench/results/slo_compete_s7/normal_quantile.py Q RATE`."""
import runpy
import sys

from scheduler import admission as A

q1 = float(sys.argv[1])
orig = A.WaitPredictor.backend_ttft


def backend_ttft(self, b, cls, uncached=None, extra_ahead=0, decoding=None, quantile=None):
    if quantile is not None and cls == 1:
        quantile = q1
    return orig(self, b, cls, uncached, extra_ahead, decoding, quantile)


A.WaitPredictor.backend_ttft = backend_ttft
sys.argv = ["warmup.py", "--seeds", "0-29", "--rate", sys.argv[2], "--admission-config",
            "arrival_quantile_from=1"]
runpy.run_path("bench/results/slo_slots_known_s6/warmup.py", run_name="__main__")
