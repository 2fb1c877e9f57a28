"""Issue 35, session 16 (H35F): what the H200's power limiter throttles by, from committed live logs
(no device time). For one grid part R (validate, decisions, steps, smi, profile):

1. every live busy step's time over the profile's base (the cost model with the power cap off, the
   idle launch added after an idle spell: `ProfileCost(hide_launch=True)`), binned by three
   exponential averages (tau) of the time before the step's start:
   U  the share of time in steps carrying prefill tokens (the model's busy share today),
   C  every step's span weighted by its compute share over the pause check step's
      (`ProfileCost.compute_share`; decode-only steps too),
   CP the same over steps with prefill only;
2. the SM clock and power (nvidia-smi, 100 ms) by the same averages, and the share of samples with
   the SW power cap active (clocks_event_reasons 0x4);
3. the power at an unthrottled clock (>= 1,950 MHz) by the compute-weighted share of the 100 ms
   before the sample (how much power each kind of work draws when the clock is free);
4. each busy step's slowdown against the SM clock sampled inside it: live / base against
   1 + cs (f_max / f - 1) (the compute part slows with the clock, the weights' read does not).

    python measure.py R [TAU_S ...]        # default taus: the profile trace's and 0.3 s
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import live_steps, read_steps
from bench.simulator.h200_clocks import read_smi
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost, _pad_tokens

F_MAX = 1980.0
BINS = ((0.0, 0.1), (0.1, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.5))


def load(R: Path):
    tag = R.name
    arr, _ = read_log(R / f"decisions_{tag}.jsonl.gz")
    rows = read_steps(R / f"steps_{tag}.jsonl.gz")
    steps, _ = live_steps(rows, {a.request_id: a.max_tokens for a in arr})
    off = float(rows[0]["t"]) - float(rows[0]["mono"])  # step log: epoch - monotonic
    prof = R / f"profile_{tag}.json"
    base = ProfileCost.from_json(prof, hide_launch=True)
    capped = ProfileCost.from_json(prof, hide_launch=True, power_cap=True)
    n = len(steps)
    b_ms, cs, tok, tokb = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    for k, s in enumerate(steps):
        if not s["d"] and not s["p"]:
            continue
        chunks = s["chunks"] or None
        ctx = s["ctx"] + sum(a + b for a, b in s["chunks"])
        t = base.step_time(s["d"], s["p"], ctx, chunks)
        if s["idle_before"]:
            t += base.launch_time(s["d"], s["p"])
        b_ms[k] = 1e3 * t
        cs[k] = base.compute_share(s["d"], s["p"], ctx, chunks)
        tok[k] = s["d"] + s["p"]
        tokb[k] = tok[k] + (float(_pad_tokens(s["d"], s["p"], base.token_buckets)) if s["p"] else 0.0)
    check = json.loads(prof.read_text()).get("pause_check") or {}
    n_ref = int(check.get("num_prefill_tokens", 512))
    cs_ref = base.compute_share(0, n_ref, n_ref, [n_ref])
    t_ref = 1e3 * base.step_time(0, n_ref, n_ref, [n_ref])
    # token rates (useful tokens, and with the graph's pad tokens) over the pause check step's
    rate = np.where(b_ms > 0, tok / np.maximum(b_ms, 1e-9), 0.0) / (n_ref / t_ref)
    rateb = np.where(b_ms > 0, tokb / np.maximum(b_ms, 1e-9), 0.0) / (n_ref / t_ref)
    return steps, off, base, capped, b_ms, cs, cs_ref, check, rate, rateb


def ewma_at_starts(steps, w, tau):
    """Exponential average (tau) at each step's start of the indicator w_j over step j's span."""
    out = np.zeros(len(steps))
    acc, t_prev = 0.0, None
    for k, s in enumerate(steps):
        t = s["start"]
        if k:
            p = steps[k - 1]
            acc = acc * np.exp((t_prev - t) / tau) + w[k - 1] * (
                np.exp((min(p["end"], t) - t) / tau) - np.exp((p["start"] - t) / tau))
        out[k] = acc
        t_prev = t
    return out


def ewma_at_times(steps, w, tau, T):
    st = np.array([s["start"] for s in steps])
    en = np.array([s["end"] for s in steps])
    out = np.zeros(len(T))
    for i, t in enumerate(T):
        j = np.searchsorted(st, t)
        lo = np.searchsorted(en, t - 8 * tau)
        ss, ee = st[lo:j], np.minimum(en[lo:j], t)
        out[i] = float((w[lo:j] * (np.exp((ee - t) / tau) - np.exp((ss - t) / tau))).sum())
    return out


def binned(x, num, den=None, fmt="{:.3f}"):
    cells = []
    for lo, hi in BINS:
        m = (x >= lo) & (x < hi)
        if m.sum() >= 20:
            v = num[m].sum() / den[m].sum() if den is not None else np.median(num[m])
            cells.append(f"[{lo:.1f},{min(hi, 1.0):.1f}) {int(m.sum()):5d}: " + fmt.format(v))
    return "  ".join(cells)


def main(argv):
    R = Path(argv[0])
    steps, off, _base, capped, b_ms, cs, cs_ref, check, rate, rateb = load(R)
    d = capped.describe()["power_cap"]
    fit = capped.sustained_fit or {}
    taus = [float(x) for x in argv[1:]] or sorted({round(capped.power_cap_tau_s or 0.1, 4), 0.3})
    live = np.array([s["ms"] for s in steps])
    has_p = np.array([s["p"] > 0 for s in steps])
    busy = (b_ms > 0) & ~np.array([s["idle_before"] for s in steps])
    runs = {r["run"]: r for r in check.get("runs", [])}
    print(f"== {R}  ({len(steps)} steps, {int(busy.sum())} busy not after idle)")
    print(f"pause check: paused {runs.get('paused', {}).get('step_ms_median', 0):.2f} ms @ "
          f"{runs.get('paused', {}).get('sm_clock_mhz')} MHz, back-to-back "
          f"{runs.get('back_to_back', {}).get('step_ms_median', 0):.2f} @ {runs.get('back_to_back', {}).get('sm_clock_mhz')}"
          f", sustained {runs.get('sustained', {}).get('step_ms_median', 0):.2f} @ "
          f"{runs.get('sustained', {}).get('sm_clock_mhz')}; model cap {d}; trace fit r "
          f"{fit.get('r', float('nan')):.3f} tau {fit.get('tau_s', float('nan')):.3f}")
    print(f"compute share: pause check step (512 prefill-only) {cs_ref:.3f}; live busy steps with prefill "
          f"median {np.median(cs[busy & has_p]):.3f}, decode-only {np.median(cs[busy & ~has_p]):.3f}")
    kinds = {"with prefill": busy & has_p, "decode-only": busy & ~has_p,
             "prefill-only": busy & has_p & np.array([s["d"] == 0 for s in steps]),
             "mixed": busy & has_p & np.array([s["d"] > 0 for s in steps])}
    for name, m in kinds.items():
        if m.sum():
            print(f"  {name:13s} {int(m.sum()):6d} steps, live / base {live[m].sum() / b_ms[m].sum():.4f}, "
                  f"median compute share {np.median(cs[m]):.3f}, token rate / ref {np.median(rate[m]):.3f} "
                  f"(with pad {np.median(rateb[m]):.3f})")
    wU = has_p.astype(float)
    wC = cs / cs_ref
    wCP = wC * has_p
    wF = rate
    print("1. live / base of busy steps (not after idle) by the exponential averages before them")
    for tau in taus:
        xs = {"U": ewma_at_starts(steps, wU, tau), "C": ewma_at_starts(steps, wC, tau),
              "CP": ewma_at_starts(steps, wCP, tau), "F": ewma_at_starts(steps, wF, tau)}
        for name in ("with prefill", "decode-only"):
            m = kinds[name]
            for key, x in xs.items():
                print(f"  tau {tau:.3f} {name:12s} by {key:2s} {binned(x[m], live[m], b_ms[m])}")
    # 2. clocks
    t_smi, rows = read_smi(str(R / f"smi_{R.name}.csv.gz"))
    T = np.array(t_smi) - off
    clk = np.array([r["clocks.sm"] if r["clocks.sm"] is not None else np.nan for r in rows])
    pw = np.array([r["power.draw"] if r["power.draw"] is not None else np.nan for r in rows])
    reason = np.array([int(r.get("clocks_event_reasons.active", "0x0"), 16) for r in rows])
    keep = (T > steps[0]["start"] + 1.0) & (T < steps[-1]["end"]) & np.isfinite(clk)
    T, clk, pw, reason = T[keep], clk[keep], pw[keep], reason[keep]
    print(f"2. SM clock (median MHz) / power (median W) / SW-power-cap share by the averages at the "
          f"{len(T)} nvidia-smi samples inside the live span")
    for tau in taus:
        for key, w in (("U", wU), ("C", wC), ("F", wF)):
            x = ewma_at_times(steps, w, tau, T)
            print(f"  tau {tau:.3f} by {key:2s} clock {binned(x, clk, fmt='{:.0f}')}")
            print(f"  tau {tau:.3f} by {key:2s} power {binned(x, pw, fmt='{:.0f}')}")
            print(f"  tau {tau:.3f} by {key:2s} cap   {binned(x, (reason & 4 > 0).astype(float), fmt='{:.2f}')}")
    # 3. power at a free clock by the compute-weighted share of the 100 ms before (boxcar)
    st = np.array([s["start"] for s in steps])
    en = np.array([s["end"] for s in steps])

    def box(w, t, W=0.1):
        j = np.searchsorted(st, t)
        lo = np.searchsorted(en, t - W)
        return float((w[lo:j] * (np.minimum(en[lo:j], t) - np.maximum(st[lo:j], t - W))).sum() / W)
    occ = np.array([box(np.ones(len(steps)), t) for t in T])
    xc = np.array([box(wC, t) for t in T])
    xp = np.array([box(wU, t) for t in T])
    free = (clk >= 1950) & (occ > 0.9)
    thr = (clk < 1950) & (occ > 0.9)
    print(f"3. power (median W) of fully busy 100 ms windows (occupancy > 0.9) by their compute-weighted "
          f"share C100: clock free (>= 1950 MHz, {int(free.sum())} samples) / throttled ({int(thr.sum())})")
    print(f"  free      {binned(xc[free], pw[free], fmt='{:.0f}')}")
    print(f"  throttled {binned(xc[thr], pw[thr], fmt='{:.0f}')}")
    print(f"  throttled clock {binned(xc[thr], clk[thr], fmt='{:.0f}')}")
    print(f"  (by U100) free {binned(xp[free], pw[free], fmt='{:.0f}')}")
    xf = np.array([box(wF, t) for t in T])
    print(f"  (by F100) free {binned(xf[free], pw[free], fmt='{:.0f}')}")
    print(f"  (by F100) throttled {binned(xf[thr], pw[thr], fmt='{:.0f}')}")
    print(f"  (by F100) throttled clock {binned(xf[thr], clk[thr], fmt='{:.0f}')}")
    if free.sum() > 10:
        X = np.stack([np.ones(free.sum()), xc[free]], axis=-1)
        c, *_ = np.linalg.lstsq(X, pw[free], rcond=None)
        print(f"  free-clock power ~ {c[0]:.0f} + {c[1]:.0f} C100 W")
    # 4. slowdown against the clock inside the step
    idx = np.searchsorted(T, st)
    inside = (idx < len(T)) & busy
    inside[inside] &= T[np.minimum(idx[inside], len(T) - 1)] < en[inside]
    k = np.flatnonzero(inside)
    f = clk[idx[k]]
    pred = 1 + cs[k] * (F_MAX / f - 1)
    print(f"4. {len(k)} busy steps with a clock sample inside: live / base against 1 + cs (1980 / f - 1), "
          f"by the clock")
    for lo, hi in ((1950, 2000), (1850, 1950), (1750, 1850), (1650, 1750), (1400, 1650)):
        m = (f >= lo) & (f < hi)
        for nm, sel in (("prefill", has_p[k]), ("decode", ~has_p[k])):
            mm = m & sel
            if mm.sum() >= 10:
                print(f"  {lo}-{hi} MHz {nm:7s} {int(mm.sum()):5d}: live/base {live[k][mm].sum() / b_ms[k][mm].sum():.3f}"
                      f"  clock model {(pred[mm] * b_ms[k][mm]).sum() / b_ms[k][mm].sum():.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
