"""Issue 35 (grid, 2026-12-04 night): what the profile lacks, filled in from live steps (a what-if,
not a model). The profile grid (sim validate's profile_grid) measured prefill chunks of 512/1024/
2048 tokens from position 0; the CUDA engine, capped at 256 prefill tokens while sequences
decode, runs almost every prefill as 256-token chunks beside the decodes, the second one from
position 256. The cost model charges those steps by interpolating between decode-only steps and
512-token chunks: 6.7B 0.84-0.90 of live. This writes a copy of a session's profile with the
points the fixed profiler (profile_grid with the engine's prefill cap) would measure, (d, 256, c)
at s = 0 and s = 256 for the profile's d and c, their times from the live steps of TRAIN seeds
only: steps with one 256-token chunk, not after an idle spell, whose prefill-busy share of the
100 ms before them was at most the profile's paused reference (f_ref: the power-cap model adds
nothing there, as at the profile's paused points), fitted per s as a + b d + e ctx (least
squares; ctx = the decodes' context tokens) and evaluated at the grid points; launch from the
profile's own launch line. The re-simulation then runs on the other seeds (held out).

    python surrogate_points.py R TAG TRAIN_SEEDS OUT.json [--decode-buckets]

--decode-buckets: also what the profiler now measures for the decode graphs (`backend profile
--decode-bucket-points on`): decode-only points at the engine's decode buckets its grid lacks (24,
48), each from the live decode-only steps of the TRAIN seeds that ran that bucket (d 17-24, 33-48;
not after a prefill step or an idle spell, f <= f_ref), fitted as a + e ctx and evaluated at d =
the bucket. (The profile also names the buckets, cuda_graph_decode_buckets; the cost model does not
use them: charging a decode step its bucket's rows needs a per-context slope this grid does not pin.)
"""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_resim import prompt_identity
from bench.simulator.fidelity_steps import busy_shares, live_steps, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

R, TAG, TRAIN, OUT = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
DECODE_BUCKETS = "--decode-buckets" in sys.argv[5:]
CUDA_DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)  # the engine's defaults
CAP = 256
validate = json.loads((R / f"validate_{TAG}.json").read_text())
seeds = [int(x) for x in validate["config"]["seeds"].split(",")]
train = {seeds.index(int(s)) for s in TRAIN.split(",")}
arrivals, _ = read_log(R / f"decisions_{TAG}.jsonl.gz")
arr = sorted(arrivals, key=lambda a: a.t)
_, runs = prompt_identity(validate["config"], len(arr))
seed_of = {a.request_id: r[0] for a, r in zip(arr, runs, strict=True)}
rows = read_steps(R / f"steps_{TAG}.jsonl.gz")
steps, bad = live_steps(rows, {a.request_id: a.max_tokens for a in arrivals})
prof_path = R / f"profile_{TAG}.json"
doc = json.loads(prof_path.read_text())
cost = ProfileCost.from_json(prof_path, hide_launch=True, power_cap=True)
f_ref = cost.power_cap_f_ref or 0.0
# each step's run seed: that of the last prefill chunk at or before it (runs are apart in time)
step_seed, cur = [], None
for r in rows:
    if r["prefill"]:
        cur = seed_of.get(r["prefill"][-1][0], cur)
    step_seed.append(cur)
data = {0: [], CAP: []}
for k, s in enumerate(steps):
    if s["p"] != CAP or len(s["chunks"]) != 1 or s["idle_before"] or not s["d"]:
        continue
    rid = rows[k]["prefill"][0][0]
    if seed_of.get(rid) not in train:
        continue
    f, _ = busy_shares(steps, k, 0.1)
    if f > f_ref:
        continue
    pos = s["chunks"][0][1]
    if pos not in data:
        continue
    dev = rows[k].get("device_ms", s["ms"])
    data[pos].append((s["d"], s["ctx"], dev))
fits = {}
for pos, v in data.items():
    a = np.array(v, dtype=float)
    X = np.stack([np.ones(len(a)), a[:, 0], a[:, 1]], axis=1)
    coef, *_ = np.linalg.lstsq(X, a[:, 2], rcond=None)
    res = a[:, 2] - X @ coef
    fits[pos] = coef
    print(f"s={pos}: {len(a)} live steps (train seeds {TRAIN}, f <= {f_ref:.2f}), d {int(a[:, 0].min())}-"
          f"{int(a[:, 0].max())}: ms = {coef[0]:.3f} + {coef[1]:.4f} d + {coef[2] * 1e3:.4f} ctx/1000; "
          f"residual sd {res.std():.3f} ms")
ds = sorted({p["num_decode_seqs"] for p in doc["points"] if p["num_decode_seqs"]})
cs = sorted({p["context_len"] for p in doc["points"] if p["num_decode_seqs"] and not p["num_prefill_tokens"]})
new = []
for pos, coef in fits.items():
    for d in ds:
        for c in cs:
            dev = float(coef @ [1.0, d, d * c])
            launch = 1e3 * cost.launch_time(d, CAP)
            new.append({"num_decode_seqs": d, "num_prefill_tokens": CAP, "context_len": c,
                        "num_prefill_seqs": 1, "prefill_context_len": pos,
                        "num_context_tokens": d * c + CAP + pos, "step_ms": dev + launch,
                        "step_ms_median": dev + launch, "launch_ms_median": launch,
                        "source": "live surrogate (what-if)"})
extra = {}
if DECODE_BUCKETS:
    have = sorted({p["num_decode_seqs"] for p in doc["points"] if p["num_decode_seqs"] and not p["num_prefill_tokens"]})
    for b in [b for b in CUDA_DECODE_BUCKETS if have[0] < b < have[-1] and b not in have]:
        lo = max(x for x in CUDA_DECODE_BUCKETS if x < b)
        v = []
        for k, st in enumerate(steps):
            if (st["p"] or not lo < st["d"] <= b or st["idle_before"] or st["prefill_before"]
                    or step_seed[k] not in train):
                continue
            f, _ = busy_shares(steps, k, 0.1)
            if f > f_ref:
                continue
            v.append((st["ctx"], rows[k].get("device_ms", st["ms"])))
        a = np.array(v, dtype=float)
        X = np.stack([np.ones(len(a)), a[:, 0]], axis=1)
        coef, *_ = np.linalg.lstsq(X, a[:, 1], rcond=None)
        print(f"decode bucket {b} (d {lo + 1}-{b}): {len(a)} live steps: ms = {coef[0]:.3f} + "
              f"{coef[1] * 1e3:.4f} ctx/1000")
        for c in cs:
            dev = float(coef @ [1.0, b * c])
            launch = 1e3 * cost.launch_time(b, 0)
            new.append({"num_decode_seqs": b, "num_prefill_tokens": 0, "context_len": c,
                        "num_prefill_seqs": 0, "prefill_context_len": 0, "num_context_tokens": b * c,
                        "step_ms": dev + launch, "step_ms_median": dev + launch,
                        "launch_ms_median": launch, "source": "live surrogate (what-if)"})
    extra["cuda_graph_decode_buckets"] = [b for b in CUDA_DECODE_BUCKETS if b <= int(doc["max_num_seqs"])]
out = dict(doc, **extra, points=doc["points"] + new, surrogate={"train_seeds": TRAIN, "f_ref": f_ref,
                                                       "fits_ms": {str(k): list(v) for k, v in fits.items()},
                                                       "num_points": len(new)})
OUT.write_text(json.dumps(out, indent=1) + "\n")
c2 = ProfileCost.from_json(OUT, hide_launch=True, power_cap=True)
print(f"wrote {OUT}: {len(new)} points added; refit r2 {cost.r2:.4f} -> {c2.r2:.4f}")
