"""Measured cost model: step times from a `tidegate backend profile` JSON, interpolated.

Model: a non-negative least-squares fit ``t = a + b·d + c·p + e·ctx + f·p²`` over the measured
points (d decode seqs, p prefill tokens, ctx context tokens), plus a piecewise-linear interpolation of
its residuals inside the convex hull of the points (scipy `LinearNDInterpolator`), so the model is
exact at measured points and extrapolates linearly outside them. Calls are memoized on
(d, p, ctx rounded to `ctx_quantum`), so the event loop pays a dict lookup per step.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
from scipy.optimize import nnls
from scipy.spatial import QhullError

from sims.cost import decode_times_by_steps

_TIME_KEYS = (("step_time_s", 1.0), ("step_s", 1.0), ("seconds", 1.0), ("step_ms", 1e-3),
              ("mean_ms", 1e-3), ("ms", 1e-3), ("time_ms", 1e-3))
_D_KEYS = ("num_decode_seqs", "decode_batch_size", "num_decode", "batch_size")
_P_KEYS = ("num_prefill_tokens", "prefill_tokens")
_C_KEYS = ("num_context_tokens", "context_tokens")


def _pick(point: dict, keys: tuple, default=None):
    for key in keys:
        if key in point:
            return point[key]
    if default is None:
        raise ValueError(f"profile point {point} has none of {keys}")
    return default


def _features(d, p, c) -> np.ndarray:
    d, p, c = (np.asarray(x, dtype=np.float64) for x in (d, p, c))
    return np.stack([np.ones_like(d), d, p, c, p * p], axis=-1)


class ProfileCost:
    def __init__(self, points: np.ndarray, times_s: np.ndarray, *, num_blocks: int | None = None,
                 block_size: int | None = None, meta: dict | None = None, ctx_quantum: int = 64):
        """points: (n, 3) of (num_decode_seqs, num_prefill_tokens, num_context_tokens)."""
        points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        times_s = np.asarray(times_s, dtype=np.float64)
        if len(points) < 2:
            raise ValueError("a profile needs at least two measured points")
        self.points, self.times_s, self.meta = points, times_s, dict(meta or {})
        self._blocks, self._block_size = num_blocks, block_size
        feats = _features(points[:, 0], points[:, 1], points[:, 2])
        scale = np.maximum(np.abs(feats).max(axis=0), 1e-12)
        coef, _ = nnls(feats / scale, times_s)
        self.coef = coef / scale
        resid = times_s - feats @ self.coef
        ss_tot = float(((times_s - times_s.mean()) ** 2).sum())
        self.r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
        self._resid = None
        span = points.max(axis=0) - points.min(axis=0)
        dims = np.flatnonzero(span > 0)
        if len(points) > len(dims) + 1 and len(dims) >= 1:
            try:
                if len(dims) == 1:
                    order = np.argsort(points[:, dims[0]])
                    xs, rs = points[order, dims[0]], resid[order]
                    self._resid = lambda q, xs=xs, rs=rs, i=dims[0]: float(
                        np.interp(q[i], xs, rs, left=0.0, right=0.0))
                else:
                    from scipy.interpolate import LinearNDInterpolator
                    lin = LinearNDInterpolator(points[:, dims] / span[dims], resid, fill_value=0.0)
                    self._resid = lambda q, lin=lin, dims=dims, span=span: float(
                        lin(np.asarray(q, dtype=np.float64)[dims] / span[dims]).ravel()[0])
            except (QhullError, ValueError) as exc:  # degenerate (coplanar) points: regression only
                warnings.warn(f"profile: residual interpolation disabled ({exc.__class__.__name__})")
        self.ctx_quantum = max(1, int(ctx_quantum))
        self._memo: dict[tuple[int, int, int], float] = {}

    @classmethod
    def from_json(cls, path: str | Path, **kwargs) -> ProfileCost:
        doc = json.loads(Path(path).read_text())
        raw = doc if isinstance(doc, list) else (doc.get("points") or doc.get("steps") or [])
        pts, times = [], []
        for point in raw:
            for key, scale in _TIME_KEYS:
                if key in point:
                    times.append(float(point[key]) * scale)
                    break
            else:
                raise ValueError(f"profile point {point} has no step time")
            pts.append((_pick(point, _D_KEYS), _pick(point, _P_KEYS, 0), _pick(point, _C_KEYS, 0)))
        meta = {} if isinstance(doc, list) else {k: v for k, v in doc.items() if k != "points"}
        return cls(np.array(pts), np.array(times), num_blocks=meta.get("num_kv_blocks"),
                   block_size=meta.get("block_size"), meta=meta, **kwargs)

    def _eval(self, d: int, p: int, c: int) -> float:
        t = float(_features(d, p, c) @ self.coef)
        if self._resid is not None:
            t += self._resid((d, p, c))
        return max(t, 1e-7)

    def step_time(self, num_decode_seqs: int, num_prefill_tokens: int,
                  num_context_tokens: int) -> float:
        if num_decode_seqs + num_prefill_tokens == 0:
            return 0.0
        key = (num_decode_seqs, num_prefill_tokens, num_context_tokens // self.ctx_quantum)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = self._eval(num_decode_seqs, num_prefill_tokens,
                                             key[2] * self.ctx_quantum)
        return t

    def decode_times(self, num_decode_seqs: int, num_context_tokens: int, k: int) -> np.ndarray:
        return decode_times_by_steps(self, num_decode_seqs, num_context_tokens, k)

    def num_kv_blocks(self, block_size: int) -> int:
        if self._blocks is None:
            raise ValueError("the profile has no num_kv_blocks; give --num-blocks")
        if self._block_size and self._block_size != block_size:
            return int(self._blocks * self._block_size // block_size)
        return int(self._blocks)

    def describe(self) -> dict:
        return {"kind": "profile", "num_points": len(self.points), "r2_linear": round(self.r2, 4),
                "coef": dict(zip(("a_s", "b_s_per_seq", "c_s_per_prefill_tok", "e_s_per_ctx_tok",
                                  "f_s_per_prefill_tok2"), map(float, self.coef))),
                **{k: v for k, v in self.meta.items() if isinstance(v, (str, int, float))}}
