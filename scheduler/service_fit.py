"""How a backend's service time depends on the request: a running least-squares fit.

A request's *service* (`scheduler.admission`: dispatch -> first token beyond its queue) is, on
one backend, about

    service ≈ a + k_u * uncached + k_d * decoding
              ─   ──────────────   ──────────────
              the step in   its own prefill:       the backend's decode load: each step it
              progress and  prompt tokens not in   waits through also carries this many
              its own       the prefix cache       decoding sequences

`ServiceFit` keeps exponentially weighted moments of (uncached, decoding, service) over the
backend's recent starts and solves the 2 x 2 normal equations for the slopes. A slope is used
only where its variable has varied (`min_spread`: a spread of a block of tokens, of one
request): with every prompt the same length, nothing says what a token costs, and the slope is
0 — the prediction is then the measured mean, as before the fit. Slopes are never negative (a
cached prompt never makes the start slower); one clamped to 0 leaves the other fitted alone.

The intercept is not kept here: `scheduler.admission` keeps the service per class with the
class's mean (uncached, decoding), and predicts ``class mean + slopes x (x - class means)``.
"""
from __future__ import annotations


class ServiceFit:
    """EWMA moments of (u, d, r) and the slopes of r on u and d (module doc)."""

    __slots__ = ("k_d", "k_u", "m", "min_spread_d", "min_spread_u", "n", "weight")

    def __init__(self, weight: float, min_spread_u: float = 16.0,
                 min_spread_d: float = 1.0) -> None:
        self.weight = weight
        self.min_spread_u = min_spread_u
        self.min_spread_d = min_spread_d
        # E[u], E[d], E[r], E[uu], E[dd], E[ud], E[ur], E[dr]
        self.m = [0.0] * 8
        self.n = 0
        self.k_u = 0.0  # seconds per uncached prompt token
        self.k_d = 0.0  # seconds per decoding sequence

    def add(self, u: float, d: float, r: float) -> None:
        w = self.weight if self.n else 1.0
        self.n += 1
        m = self.m
        for i, x in enumerate((u, d, r, u * u, d * d, u * d, u * r, d * r)):
            m[i] += w * (x - m[i])
        self._solve()

    def _solve(self) -> None:
        mu, md, mr, muu, mdd, mud, mur, mdr = self.m
        vuu = muu - mu * mu
        vdd = mdd - md * md
        vud = mud - mu * md
        cur = mur - mu * mr
        cdr = mdr - md * mr
        use_u = vuu >= self.min_spread_u ** 2
        use_d = vdd >= self.min_spread_d ** 2
        self.k_u = self.k_d = 0.0
        if use_u and use_d:
            det = vuu * vdd - vud * vud
            if det > 1e-9 * vuu * vdd:  # not collinear
                k_u = (cur * vdd - cdr * vud) / det
                k_d = (cdr * vuu - cur * vud) / det
                if k_u > 0.0 and k_d > 0.0:
                    self.k_u, self.k_d = k_u, k_d
                    return
            # one slope alone: the variable that explains more of r
            if cur * cur / vuu >= cdr * cdr / vdd:
                use_d = False
            else:
                use_u = False
        if use_u:
            self.k_u = max(0.0, cur / vuu)
        elif use_d:
            self.k_d = max(0.0, cdr / vdd)
