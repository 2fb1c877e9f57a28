"""Issue 35, session 19: the unequal-contexts term end to end on a profile WITH spread points, before any
device call made one: the H100 mixed part's own profile plus seven spread points (d - 1 sequences at 512,
the last at 2,048; d 2-128) timed by the fitted model at the launch model's multiple for kappa 2.5, and the
`decode_attention` plan of the kernel's constants. Checks that ProfileCost splits them out of the fit,
reads kappa back per point, and that validate_replay's default (measured) reproduces the kappa-2.5
what-if (run.sh). Not a measurement: the points are synthetic.

    python pipeline_check.py [OUT_DIR]      (default /tmp/spread_pipeline; then validate_replay, below)
"""
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from sims.decode_spread import DecodeLaunchPlan, spread_factor
from sims.profile_cost import ProfileCost

src = Path(__file__).resolve().parents[1] / "fidelity_grid_h100_s18" / "6.7b-mixed"
dst = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/spread_pipeline") / "6.7b-mixed"
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
doc = json.loads((src / "profile_6.7b-mixed.json").read_text())
val = json.loads((src / "validate_6.7b-mixed.json").read_text())
terms = dict(val["profile"]["model_terms"])
cost = ProfileCost.from_json(src / "profile_6.7b-mixed.json", **terms)
plan = DecodeLaunchPlan.legacy(32, doc["cuda_graph_decode_buckets"], doc["max_model_len"])
doc["decode_attention"] = {"kernel": "triton", "cuda_graphs": True, "num_kv_heads": 32, "sm_count": 132, "kv_cache_dtype": "auto",
    "block_n": 64, "split_context_len": doc["max_model_len"],
    "buckets": {str(b): {"splits": s, "resident_programs": r} for b, s, r in zip(plan.buckets, plan.splits, plan.resident)}}
c0 = 512
for d in (2, 4, 8, 16, 32, 64, 128):
    ctxs = [c0] * (d - 1) + [4 * c0]
    total = sum(ctxs)
    m = spread_factor(ctxs, plan, 2.5)
    dev = cost.step_time(d, 0, int(total * m)) * 1e3    # what the fit charges (device time or step - launch)
    launch = cost.launch_time(d, 0) * 1e3
    doc["points"].append({"num_decode_seqs": d, "num_prefill_tokens": 0, "context_len": round(total / d),
        "num_prefill_seqs": 0, "prefill_context_len": 0, "num_context_tokens": total,
        "step_ms": dev + launch, "step_ms_median": dev + launch, "launch_ms_median": launch, "repeats": 7,
        "decode_context_lens": [[d - 1, c0], [1, 4 * c0]], "decode_spread": "one_long"})
(dst / "profile_6.7b-mixed.json").write_text(json.dumps(doc))
c2 = ProfileCost.from_json(dst / "profile_6.7b-mixed.json", **terms)
print("kappa", c2.spread_kappa, [round(p["kappa"], 3) for p in c2.spread_point_kappas])
