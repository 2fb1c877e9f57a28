"""Issue 35, session 17 (H35Q): the cost model at every live step, binned finely, for a grid part.

The model is built as `validate_replay` builds it (the part's own profile, the validate's recorded
model terms: hide_launch + power_cap), and charged at each live step's composition with
`bench.simulator.fidelity_steps.model_step_ms` (the power-cap shares and the idle launch as the
simulator applies them). Bins: step kind, decode count (decode graph bucket), prefill tokens, the
mixed-step graph's token bucket (d + p rounded up), the decodes' mean context; each row: n, live ms,
model ms, model/live of the totals, and the time-weighted error's share of the part's total error.
Also per load (the step log's runs, by the validate's run windows when present).

    [DECODE_TAIL=nearest|slope] python step_bins.py PART_DIR [PROFILE]   (PROFILE: default the part's own)
"""
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import live_steps, model_step_ms, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost


def build(part_dir: Path, profile: str | None, **extra):
    tag = part_dir.name
    val = json.loads((part_dir / f"validate_{tag}.json").read_text())
    terms = dict(val["profile"]["model_terms"])
    if os.environ.get("DECODE_TAIL"):  # nearest (the model before session 17) | slope (default)
        terms["decode_extrapolation"] = os.environ["DECODE_TAIL"]
    terms.update(extra)
    prof = profile or str(part_dir / f"profile_{tag}.json")
    return ProfileCost.from_json(prof, **terms), terms, prof


def load_steps(part_dir: Path):
    """The live steps (`live_steps`), each with "load": the load label of the run whose request
    the step prefills (decode-only steps: of the last step with prefill before them), "warm-up"
    for the warm-up's."""
    from bench.simulator.session_records import run_arrivals
    tag = part_dir.name
    val = json.loads((part_dir / f"validate_{tag}.json").read_text())
    arr, batches = read_log(part_dir / f"decisions_{tag}.jsonl.gz")
    rows = read_steps(part_dir / f"steps_{tag}.jsonl.gz")
    steps, bad = live_steps(rows, {a.request_id: a.max_tokens for a in arr})
    label = {}
    for (_si, li), (ars, _bs) in run_arrivals(val, arr, batches).items():
        for a in ars:
            label[a.request_id] = val["loads"][li]["load_label"]
    cur = "warm-up"
    for row, s in zip(rows, steps, strict=True):
        if row["prefill"]:
            cur = label.get(str(row["prefill"][0][0]), "warm-up")
        s["load"] = cur
    return steps, bad


def bucket(n, buckets):
    if buckets is None:
        return None
    i = int(np.searchsorted(buckets, n))
    return int(buckets[i]) if i < len(buckets) else None


def table(rec, key, title, total_err):
    bins = {}
    for s, t in rec:
        k = key(s)
        if k is None:
            continue
        b = bins.setdefault(k, [0, 0.0, 0.0])
        b[0] += 1
        b[1] += s["ms"]
        b[2] += t
    print(f"\n{title}")
    print(f"  {'bin':34s} {'n':>6s} {'live ms':>8s} {'model ms':>9s} {'model/live':>10s} {'err share':>9s}")
    for k in sorted(bins, key=lambda x: (str(type(x)), x)):
        n, lv, md = bins[k]
        print(f"  {k!s:34s} {n:6d} {lv / n:8.3f} {md / n:9.3f} {md / lv:10.4f} {(md - lv) / total_err:9.2f}")


def main(argv):
    part = Path(argv[0])
    cost, terms, prof = build(part, argv[1] if len(argv) > 1 else None)
    steps, bad = load_steps(part)
    rec = [(steps[k], t) for k, t, _f in model_step_ms(cost, steps)]
    live = sum(s["ms"] for s, _ in rec)
    model = sum(t for _, t in rec)
    err = model - live
    print(f"== {part.name}: profile {Path(prof).name}, terms {terms}; {len(rec)} steps, rebuild mismatches {bad}")
    print(f"   total live {live / 1e3:.2f} s, model {model / 1e3:.2f} s, model/live {model / live:.4f}; "
          f"'err share' = the bin's (model - live) / the part's total ({err / 1e3:+.3f} s)")
    tb = cost.token_buckets
    dec_b = np.array(cost.meta.get("cuda_graph_decode_buckets") or [], dtype=float)
    table(rec, lambda s: ("decode-only" if not s["p"] else "mixed (d>0, p>0)" if s["d"] else "prefill-only")
          + (", after idle" if s["idle_before"] else ""), "step kind", err)
    table(rec, lambda s: None if s["p"] else f"d bucket {bucket(s['d'], dec_b):4d}", "decode-only by decode graph bucket", err)
    table(rec, lambda s: None if s["p"] else f"ctx/d {int(s['ctx'] / max(s['d'], 1) // 128 * 128):5d}",
          "decode-only by mean context (128s)", err)
    table(rec, lambda s: None if not s["p"] else f"p {s['p']:5d}" if s["p"] in (256, 512) or s["p"] % 256 == 0
          else f"p {int(s['p'] // 256 * 256):5d}+ (other)", "with prefill, by prefill tokens", err)
    table(rec, lambda s: None if not s["p"] else f"p {min(s['p'], 999):4d}.. d {min(32, 1 << max(0, s['d'].bit_length() - 1)) if s['d'] else 0:3d}+"
          if s["p"] in (256, 512) else None, "p = 256 / 512 steps, by decode count (powers of 2)", err)
    table(rec, lambda s: None if not s["p"] else f"token bucket {bucket(s['d'] + s['p'], tb)}",
          "with prefill, by mixed graph token bucket (d + p)", err)
    for kind, sel in (("all", lambda s: True), ("decode-only", lambda s: not s["p"]),
                      ("with prefill", lambda s: s["p"] > 0), ("with prefill > 512", lambda s: s["p"] > 512)):
        table(rec, lambda s, sel=sel: s["load"] if sel(s) else None, f"by load: {kind}", err)
    for load in ("0.8x", "0.95x"):
        sub = [(s, t) for s, t in rec if s["load"] == load]
        e = sum(t - s["ms"] for s, t in sub)
        lv = sum(s["ms"] for s, _ in sub)
        table(sub, lambda s: (f"decode-only d {bucket(s['d'], dec_b):4d}" if not s["p"] else
                              f"with prefill, token bucket {bucket(s['d'] + s['p'], tb)}"),
              f"load {load} (model/live {(lv + e) / lv:.4f}; err share of this load's {e / 1e3:+.3f} s)", e)
    table(rec, lambda s: None if not s["p"] else f"chunks {len(s['chunks'])}, prefix {'yes' if any(st for _, st in s['chunks']) else 'no'}",
          "with prefill, by chunks / cached prefix", err)


if __name__ == "__main__":
    main(sys.argv[1:])
