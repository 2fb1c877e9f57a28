"""Issue 35, session 15: how fast the H200's SM clock follows the load, from committed live logs (no
device time). For every nvidia-smi sample (every 100 ms, `scripts/fidelity_h200.sh`) taken while the
backend served (inside the step log's span), the exponential averages with time constant tau of two
busy indicators before it — steps carrying prefill tokens, decode-only steps (the step log's wall
clock `t` and `ms`) — and a least-squares line clock = c0 + c1 x_prefill + c2 x_decode; R^2 by tau.
The tau with the best fit is the live counterpart of the profile's sustained trace's (sims.profile_cost
fit_sustained_trace); the 100 ms window the model used is ~ tau 50 ms (a boxcar's mean age).
Also the clock by the prefill average at the best tau (binned).

    python clock_tau.py SMI.csv.gz STEPS.jsonl.gz
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.simulator.fidelity_steps import read_steps
from bench.simulator.h200_clocks import read_smi


def ewma_at(times, starts, ends, tau):
    """Exponential average (tau) at each of `times` of the indicator of the spans [starts, ends)."""
    out = np.zeros(len(times))
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    for i, T in enumerate(times):
        j = np.searchsorted(s, T)  # spans starting before T
        lo = np.searchsorted(e, T - 8 * tau)  # ends sorted too (back-to-back steps)
        ss, ee = s[lo:j], np.minimum(e[lo:j], T)
        out[i] = float((np.exp((ee - T) / tau) - np.exp((ss - T) / tau)).sum())
    return out


def main(argv):
    t_smi, rows = read_smi(argv[0])
    steps = read_steps(argv[1])
    st = np.array([s["t"] for s in steps])
    en = st + np.array([s["ms"] for s in steps]) / 1e3
    pf = np.array([bool(s["prefill_tokens"]) for s in steps])
    T = np.array(t_smi)
    clk = np.array([r["clocks.sm"] if r["clocks.sm"] is not None else np.nan for r in rows])
    pw = np.array([r["power.draw"] if r["power.draw"] is not None else np.nan for r in rows])
    m = (T > st[0] + 1.0) & (T < en[-1]) & np.isfinite(clk)
    T, clk, pw = T[m], clk[m], pw[m]
    print(f"{len(T)} clock samples inside the {len(steps)} live steps' span")
    print(f"{'tau ms':>7} {'R2 clock':>9} {'c1 (prefill) MHz':>17} {'c2 (decode) MHz':>16} {'R2 power':>9}")
    best = None
    for tau in (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0):
        xp = ewma_at(T, st[pf], en[pf], tau)
        xd = ewma_at(T, st[~pf], en[~pf], tau)
        X = np.stack([np.ones_like(xp), xp, xd], axis=-1)
        res = []
        for y in (clk, pw):
            ok = np.isfinite(y)
            c, *_ = np.linalg.lstsq(X[ok], y[ok], rcond=None)
            r2 = 1 - ((X[ok] @ c - y[ok]) ** 2).sum() / ((y[ok] - y[ok].mean()) ** 2).sum()
            res.append((c, r2))
        (c, r2), (_, r2p) = res
        print(f"{tau * 1e3:>7.0f} {r2:>9.3f} {c[1]:>17.0f} {c[2]:>16.0f} {r2p:>9.3f}")
        if best is None or r2 > best[0]:
            best = (r2, tau, xp)
    r2, tau, xp = best
    print(f"best tau {tau * 1e3:.0f} ms (R2 {r2:.3f}); clock and power by the prefill average at it:")
    for lo, hi in ((0, 0.1), (0.1, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01)):
        k = (xp >= lo) & (xp < hi)
        if k.sum():
            print(f"  x_prefill {lo:.1f}-{min(hi, 1):.1f}: {k.sum():5d} samples, SM {np.median(clk[k]):6.0f} MHz, "
                  f"power {np.nanmedian(pw[k]):5.0f} W")


if __name__ == "__main__":
    main(sys.argv[1:])
