"""Issue 35, session 18 (H35P): what the next profile's "sustained_packed" run should read, from the live
steps of the committed H200 parts, and a WHAT-IF profile that carries a stand-in for it.

The run (bench/engine/profile.py) times the grid's largest prefill-only step (2,048 tokens in 4
prompts on the validate's grids) paused, then 2.5 s back to back: r_packed = sustained / paused.
No committed profile has it. The live steps it stands for are the engine's ~2,000-token packed
prefill steps (> 1,024 prefill tokens, 4-5 prompts, beside 0-100 decodes). Per part:

- live / base of those steps not after idle (base: the cost model with the power cap off, at each
  step's own composition), overall and by U, the exponential average (tau 0.3 s, the live clock's
  time constant: bench/results/fidelity_cost_s15) of the time in steps with prefill before them;
- the stand-in r_packed = live / base over those steps at U >= FULL (as session 16's stand-in for
  the mixed run, whatif_mixed_run.py there): a LOWER bound for the sustained run's ratio, whose
  steps follow packed steps only, where the live ones mostly follow lighter mixed steps;
- the what-if profile (OUT, optional): the part's own profile with the stand-in run appended
  (paused = the base at (0, 2,048, k 4), back to back = paused x r_packed, no trace: the model takes
  the level as measured; where a trace is needed for the limiter's tau, `--tau` gives a synthetic
  one settling with that tau, marked as such).

    python whatif_packed_run.py PART_DIR [OUT.json [--tau S] [--profile P] [--r R]]

(`--r`: the run's ratio set to R instead of the stand-in, for the model's sensitivity to it;
`--profile`: start from another profile of the part than its own, e.g. session 16's what-if with
the mixed run stood in, ../fidelity_cost_s16/profile_<part>_whatif_mixed.json.)
"""
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import busy_shares, live_steps, read_steps
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

BIG = 1024  # live steps with more prefill tokens than this: the packed steps
FULL = 0.5
TAU_U = 0.3
SHAPE = (2048, 4)  # the validate grid's largest prefill-only point


def main(argv):
    R = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 and not argv[1].startswith("--") else None
    tau_trace = float(argv[argv.index("--tau") + 1]) if "--tau" in argv else None
    tag = R.name
    prof = Path(argv[argv.index("--profile") + 1]) if "--profile" in argv else R / f"profile_{tag}.json"
    doc = json.loads(prof.read_text())
    arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
    steps, _ = live_steps(read_steps(R / f"steps_{tag}.jsonl.gz"), {a.request_id: a.max_tokens for a in arr})
    base = ProfileCost.from_json(prof, hide_launch=True)
    rows = []
    for k, s in enumerate(steps):
        if s["idle_before"] or s["p"] <= BIG:
            continue
        ctx = s["ctx"] + sum(n + st for n, st in s["chunks"])
        u = busy_shares(steps, k, 6 * TAU_U, TAU_U)[0]
        rows.append((u, s["ms"], 1e3 * base.step_time(s["d"], s["p"], ctx, s["chunks"]), s["d"], len(s["chunks"])))
    n, p = SHAPE
    paused = 1e3 * base.step_time(0, n, n, [n // p] * p)
    point = next((x for x in doc["points"] if x["num_decode_seqs"] == 0 and x["num_prefill_tokens"] == n
                  and x.get("num_prefill_seqs") == p and not x.get("prefill_context_len")), None)
    pc = doc.get("pause_check", {})
    runs = {r["run"]: r for r in pc.get("runs", [])}
    print(f"== {tag}: pause check paused {runs.get('paused', {}).get('step_ms_median', float('nan')):.2f} ms, "
          f"sustained {runs.get('sustained', {}).get('step_ms_median', float('nan')):.2f} ms; profile point "
          f"(0, {n}, k {p}): {point['step_ms_median']:.2f} ms @ {point.get('sm_clock_mhz')} MHz, base {paused:.2f} ms")
    if not rows:
        print(f"  no busy live step with > {BIG} prefill tokens: no stand-in")
        return
    a = np.array(rows)
    print(f"  live busy steps with > {BIG} prefill tokens: {len(a)}, decodes beside them median {np.median(a[:, 3]):.0f}, "
          f"prompts median {np.median(a[:, 4]):.0f}; live / base {a[:, 1].sum() / a[:, 2].sum():.4f}")
    line = "  by U (tau 0.3 s):"
    for lo, hi in ((0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01)):
        m = (a[:, 0] >= lo) & (a[:, 0] < hi)
        if m.any():
            line += f"  [{lo:.1f},{min(hi, 1):.1f}) {int(m.sum()):4d}: {a[m, 1].sum() / a[m, 2].sum():.4f}"
    print(line)
    sel = a[:, 0] >= FULL
    if not sel.any():
        print(f"  none at U >= {FULL}: no stand-in")
        return
    r_packed = float(a[sel, 1].sum() / a[sel, 2].sum())
    print(f"  stand-in r_packed (U >= {FULL}, {int(sel.sum())} steps): {r_packed:.4f}")
    if "--r" in argv:
        r_packed = float(argv[argv.index("--r") + 1])
        print(f"  r_packed set to {r_packed} (--r)")
    if out is None:
        return
    run = {"run": "sustained_packed", "pause_ms": 0.0, "num_decode_seqs": 0, "num_prefill_tokens": n,
           "num_prefill_seqs": p, "decode_context_len": 0, "paused_ms_median": round(paused, 4),
           "paused_pause_ms": doc.get("pause_ms"), "step_ms_median": round(paused * r_packed, 4),
           "whatif": (f"stand-in from the live steps of {tag}: {int(sel.sum())} busy steps of > {BIG} prefill "
                      f"tokens at U >= {FULL} (tau {TAU_U} s), r_packed {r_packed:.4f}"
                      + (" (set by --r)" if "--r" in argv else " = their live / base"))}
    if tau_trace is not None:  # a synthetic trace settling at the level with that tau (marked)
        t, ts, ms = 0.0, [], []
        while t < 2.5:
            x = paused * (1 + (r_packed - 1) * -math.expm1(-t / tau_trace))
            ts.append(round(t * 1e3, 3))
            ms.append(round(x, 4))
            t += x / 1e3
        run.update(trace_t_ms=ts, trace_ms=ms)
        run["whatif"] += f"; SYNTHETIC trace with tau {tau_trace} s"
    pc["runs"] = [r for r in pc.get("runs", []) if r["run"] != "sustained_packed"] + [run]
    doc["whatif_sustained_packed"] = run["whatif"]
    out.write_text(json.dumps(doc, indent=1))
    check = ProfileCost.from_json(out, hide_launch=True, power_cap=True, cap_by_power=True)
    pcd = check.describe()["power_cap"]
    print(f"  what-if model: r {pcd['back_to_back']:.4f}, tau {pcd['tau_s']}, f_ref {pcd['f_ref']:.3f}; "
          f"packed anchor {json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in (pcd.get('by_power_packed') or {}).items() if k != 'whatif'})}")


if __name__ == "__main__":
    main(sys.argv[1:])
