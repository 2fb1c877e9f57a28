"""Issue 35, session 14: the 33B's TTFT P50 intervals (±7-9% at 0.8-0.95x over five seeds) — seed
noise or systematic? Per run (two device calls: s11 seeds 0-2, s13 seeds 3-4):

- the replay + delivery path's TTFT / TPOT P50 error (sim validate's own, as recorded);
- the step-cost LEVEL of the run: the model's time at every live step of the run (its composition,
  `fidelity_steps.model_step_ms`, the validate's model terms) over the live time, all busy steps
  and decode-only steps apart;
- the same replay with that run's steps scaled by live/model (one number per run, a diagnostic:
  `validate_replay(cost_scale=...)`): what is left when only the level is right;
- the replay with every live step time fed back (s13 analysis, `fidelity_steps --live-times`);
- the load generator's schedule: the run's live TTFT P50 and its simulated queueing gain
  (d ln TTFT_sim / d ln step time, from a 2% scale).

    python ttft_spread.py [S11_DIR S13_DIR S13_ANALYSIS] > ttft_spread.txt
"""
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))

from bench.simulator.fidelity_resim import prompt_identity
from bench.simulator.fidelity_stats import mean_ci
from bench.simulator.fidelity_steps import live_steps, model_step_ms, read_steps
from bench.simulator.validate_replay import replay_session
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

args = sys.argv[1:] or [str(HERE.parents[1] / "fidelity_grid_h200_s11" / "33b"),
                        str(HERE.parents[1] / "fidelity_grid_h200_s13" / "33b-seeds"),
                        str(HERE.parents[1] / "fidelity_grid_h200_s13" / "analysis")]
SESSIONS = [("s11", Path(args[0]), "33b", "steps_33b-s11_live_times.json"),
            ("s13", Path(args[1]), "33b-seeds", "steps_33b-seeds_live_times.json")]
A13 = Path(args[2])


def per_run_levels(v, arrivals, rows, profile):
    """(seed index, load index) -> (model/live over busy steps, over decode-only steps, over steps
    with prefill), each the ratio of the totals over the run's steps (a step belongs to the run of
    the latest request it or a step before it prefilled)."""
    steps, bad = live_steps(rows, {a.request_id: a.max_tokens for a in arrivals})
    assert bad == 0, bad
    cost = ProfileCost.from_json(profile, **v["profile"]["model_terms"])
    model = {k: t for k, t, _ in model_step_ms(cost, steps)}
    arr = sorted(arrivals, key=lambda a: a.t)
    _, runs = prompt_identity(v["config"], len(arr))
    run_of = {a.request_id: r for a, r in zip(arr, runs, strict=True)}
    cur, acc = None, {}
    for k, (s, row) in enumerate(zip(steps, rows, strict=True)):
        for rid, _n, _p in row["prefill"]:
            cur = run_of.get(rid, cur)
        if cur is None or cur == (-1, -1) or k not in model:
            continue
        a = acc.setdefault(cur, np.zeros(6))
        kind = 0 if not s["p"] else 1
        a[2 * kind] += model[k]
        a[2 * kind + 1] += s["ms"]
        a[4] += model[k]
        a[5] += s["ms"]
    return {r: (a[4] / a[5], a[0] / a[1], a[2] / a[3]) for r, a in acc.items()}


rows_out = []
for name, R, tag, live_json in SESSIONS:
    v = json.loads((R / f"validate_{tag}.json").read_text())
    arrivals, batches = read_log(R / f"decisions_{tag}.jsonl.gz")
    rows = read_steps(R / f"steps_{tag}.jsonl.gz")
    prof = str(R / f"profile_{tag}.json")
    lev = per_run_levels(v, arrivals, rows, prof)
    seeds = [int(x) for x in str(v["config"]["seeds"]).split(",")]
    labels = [ld["load_label"] for ld in v["loads"]]
    scale_of = {(seeds[si], labels[li]): 1.0 / lev[(si, li)][0] for (si, li) in lev}
    base = replay_session(v, arrivals, batches, rows, prof, "recorded")
    lvl = replay_session(v, arrivals, batches, rows, prof, "recorded", cost_scale=lambda s, ld, m=scale_of: m[(s, ld)])
    up = replay_session(v, arrivals, batches, rows, prof, "recorded", cost_scale=lambda s, ld: 1.02)
    lt = json.loads((A13 / live_json).read_text())["resim"]["loads"]
    for li, ld in enumerate(v["loads"]):
        for si, run in enumerate(ld["runs"]):
            b = base["loads"][li]["runs"][si]["compare_replay_path"]
            c = lvl["loads"][li]["runs"][si]["compare_replay_path"]
            u = up["loads"][li]["runs"][si]["compare_replay_path"]
            ltr = next(r for r in lt[li]["runs"] if int(r["seed"]) == int(run["seed"]))["compare"]
            gain = np.log(u["ttft_p50"]["sim"] / b["ttft_p50"]["sim"]) / np.log(1.02)
            rows_out.append({"session": name, "seed": int(run["seed"]), "load": ld["load_label"],
                             "ttft_live": b["ttft_p50"]["live"], "ttft_err": b["ttft_p50"]["rel_err"],
                             "tpot_err": b["tpot_p50"]["rel_err"], "level": lev[(si, li)][0],
                             "level_decode": lev[(si, li)][1], "level_prefill": lev[(si, li)][2],
                             "ttft_err_level": c["ttft_p50"]["rel_err"], "tpot_err_level": c["tpot_p50"]["rel_err"],
                             "ttft_err_live_times": ltr["ttft_p50"]["rel_err"], "gain": gain,
                             "same": base["loads"][li]["runs"][si]["steps_path"]["same_prefill_step_share"],
                             "same_level": lvl["loads"][li]["runs"][si]["steps_path"]["same_prefill_step_share"],
                             "recorded": run["compare_replay_path"]["ttft_p50"]["rel_err"]})

print("33B bf16 512/128, five seeds from two device calls (s11: seeds 0-2, s13: seeds 3-4); errors in %,")
print("level = model / live step time over the run's busy steps (decode-only / with prefill)")
print(f"{'load':6s}{'call':>5s}{'seed':>5s}{'live TTFT':>10s}{'TTFT err':>9s}{'TPOT err':>9s}{'level':>7s}"
      f"{'dec':>7s}{'pre':>7s}{'gain':>6s}{'level fixed':>12s}{'TPOT':>7s}{'live times':>11s}")
for r in sorted(rows_out, key=lambda r: (float(r["load"].rstrip("x")), r["session"], r["seed"])):
    print(f"{r['load']:6s}{r['session']:>5s}{r['seed']:>5d}{r['ttft_live']:10.1f}{100 * r['ttft_err']:+9.1f}"
          f"{100 * r['tpot_err']:+9.1f}{r['level']:7.3f}{r['level_decode']:7.3f}{r['level_prefill']:7.3f}"
          f"{r['gain']:6.1f}{100 * r['ttft_err_level']:+12.1f}{100 * r['tpot_err_level']:+7.1f}"
          f"{100 * r['ttft_err_live_times']:+11.1f}")
print()
print("per load, mean ± 95% t interval over the five runs (TTFT P50 error, %):")
print(f"{'load':6s}{'as run':>14s}{'level fixed':>14s}{'live times':>14s}   level by call (s11 / s13)"
      "   TTFT err by call   corr(err, level-1)")
for ld in sorted({r["load"] for r in rows_out}, key=lambda x: float(x.rstrip("x"))):
    rs = [r for r in rows_out if r["load"] == ld]

    def ci(key, rs=rs):
        m = mean_ci([r[key] for r in rs])
        return f"{100 * m['mean']:+.1f} ± {100 * m['ci']:.1f}"

    by = {s: [r for r in rs if r["session"] == s] for s in ("s11", "s13")}
    lv = " / ".join(f"{np.mean([r['level'] for r in x]):.3f}" for x in by.values())
    te = " / ".join(f"{100 * np.mean([r['ttft_err'] for r in x]):+.1f}" for x in by.values())
    cc = np.corrcoef([r["ttft_err"] for r in rs], [r["level"] for r in rs])[0, 1]
    print(f"{ld:6s}{ci('ttft_err'):>14s}{ci('ttft_err_level'):>14s}{ci('ttft_err_live_times'):>14s}   "
          f"{lv:>22s}   {te:>16s}   {cc:+.2f}")
print()
print("prefill steps with the same chunks, mean over the five runs: as run / level fixed per run")
for ld in sorted({r["load"] for r in rows_out}, key=lambda x: float(x.rstrip("x"))):
    rs = [r for r in rows_out if r["load"] == ld]
    print(f"{ld:6s} {100 * np.mean([r['same'] for r in rs]):5.1f}% / {100 * np.mean([r['same_level'] for r in rs]):5.1f}%")
print()
print("against the validate's recorded replay + delivery path TTFT P50 error (largest difference, points; "
      "the s11 call predates the compute-share power cap, e038184): "
      f"{100 * max(abs(r['ttft_err'] - r['recorded']) for r in rows_out):.2f}")
Path(HERE / "ttft_spread.json").write_text(json.dumps(rows_out, indent=1) + "\n")
