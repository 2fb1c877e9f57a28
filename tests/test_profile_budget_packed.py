"""The profiler's budget-filling packed point (issue 35, session 18, H35G): on the validate's grid one
more point, (64 decodes, 1,984 tokens in 4 prompts), where the engine's largest live steps (d + p =
the 2,048-token budget, several prompts beside 27-90 decodes) had no point with d > 0 and p > 1,024;
and the cost model interpolating with it (closed form on a synthetic profile)."""
from __future__ import annotations

import numpy as np
import pytest

from bench.engine.profile import step_shapes
from bench.simulator import validate
from sims.profile_cost import ProfileCost

BUDGET = 2048


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _grid_shapes(budget_packed: bool = True):
    g = validate.profile_grid(512, 128, prefill_cap_tokens=256)
    return step_shapes(_ints(g["decode_batch_sizes"]), _ints(g["prefill_tokens"]), _ints(g["context_lens"]),
                       [2, 4], _ints(g["prefill_context_lens"]), None, max_num_seqs=256,
                       max_num_batched_tokens=BUDGET, max_model_len=16384, budget_packed=budget_packed)


def test_the_validate_grid_gains_one_point_at_the_packed_decode_batch():
    new, old = _grid_shapes(), _grid_shapes(budget_packed=False)
    # the grid before, in its order, then the one point: d 64 (the middle of the packed d 0 and
    # 128), 4 x 496 tokens
    assert new[:-1] == old and new[-1] == (64, 1984, 512, 4, 0)
    # before it no point with decodes held more than 1,024 prefill tokens
    assert max(p for d, p, *_ in old if d) == 1024


def test_no_point_where_the_grid_reaches_the_budget_or_packs_nothing():
    kw = {"max_num_seqs": 256, "max_num_batched_tokens": 4096, "max_model_len": 4096}
    # 64 + 2,048 fits 4,096: the grid's own packed points reach the budget
    a = step_shapes([0, 1, 8, 64], [0, 512, 2048], [128], [2, 4], [], None, **kw)
    assert a == step_shapes([0, 1, 8, 64], [0, 512, 2048], [128], [2, 4], [], None, budget_packed=False, **kw)
    # no k > 1 asked: no packed point of any kind
    b = step_shapes([0, 1, 128], [0, 2048], [512], [], [], None, max_num_seqs=256,
                    max_num_batched_tokens=BUDGET, max_model_len=4096)
    assert all(k <= 1 for *_, k, _s in b)
    # explicit packed batches: the one point at the largest grid d <= half the largest of them
    c = step_shapes([0, 32, 128], [0, 2048], [512], [4], [], [0, 32, 128], max_num_seqs=256,
                    max_num_batched_tokens=BUDGET, max_model_len=4096)
    assert [x for x in c if x[3] == 4 and x[0]] == [(32, 2016, 512, 4, 0)]
    # no grid d in the middle: none
    e = step_shapes([0, 128], [0, 2048], [512], [4], [], None, max_num_seqs=256,
                    max_num_batched_tokens=BUDGET, max_model_len=4096)
    assert [x for x in e if x[3] == 4 and x[0]] == []


# a step-time law linear in the cost model's features, plus an excess only where decodes run beside
# more than 1,024 prefill tokens, growing with d (the budget-filling packed steps): no point of the
# old grid sees it
A, B, C, E, F, G, M = 4e-3, 2e-5, 1.2e-5, 1e-7, 2e-9, 3e-4, 1.5e-3
EXCESS_S = 3e-3  # at d = 64


def _law(d: int, chunks: list[tuple[int, int]], ctx: int) -> float:
    p = sum(n for n, _ in chunks)
    q = sum(n * n for n, _ in chunks)
    t = A + B * d + C * p + E * ctx + F * q + G * len(chunks) + (M if p else 0.0)
    return t + (EXCESS_S * d / 64 if d and p > 1024 else 0.0)


def _profile(shapes) -> ProfileCost:
    pts, times = [], []
    for d, p, c, k, s in shapes:
        ctx = d * c + p + k * s
        pts.append((d, p, ctx, k if p else 0, s))
        times.append(_law(d, [(p // k, s)] * k if p else [], ctx))
    # ctx_quantum 1: the query below sits exactly on a segment between two points
    return ProfileCost(np.array(pts, dtype=float), np.array(times), ctx_quantum=1)


def test_the_cost_model_interpolates_the_packed_steps_with_the_point():
    # the midpoint of (0, 2,048 in 4) and the new (64, 1,984 in 4) in every coordinate of the
    # model's residual space: d 32, p 2,016, ctx (2,048 + 34,752) / 2, Σp_i² of the two's mean
    # (512, 496, 512, 496); d + p = 2,048 as live
    chunks = [(512, 0), (496, 0), (512, 0), (496, 0)]
    ctx = (2048 + 64 * 512 + 1984) // 2
    truth = _law(32, chunks, ctx)  # the excess is linear in d along the segment: half of it here
    new, old = _profile(_grid_shapes()), _profile(_grid_shapes(budget_packed=False))
    t_new, t_old = new.step_time(32, 2016, ctx, chunks), old.step_time(32, 2016, ctx, chunks)
    # exact at the new point itself, and on the segment to within 1% of the excess
    assert new.step_time(64, 1984, 64 * 512 + 1984, [496] * 4) == pytest.approx(
        _law(64, [(496, 0)] * 4, 64 * 512 + 1984), rel=1e-9)
    assert abs(t_new - truth) < 0.01 * EXCESS_S / 2, (t_new, truth)
    # the grid before cannot see the excess: the step charged it (half of 3 ms) short
    assert t_old == pytest.approx(truth - EXCESS_S / 2, abs=0.05 * EXCESS_S / 2), (t_old, truth)
    # the point is left out of the regression (its excess would move every step the residuals do
    # not pin): the same coefficients, every old point and steps away from it charged as before
    assert new.num_budget_points == 1 and old.num_budget_points == 0
    np.testing.assert_allclose(new.coef, old.coef, rtol=1e-9, atol=1e-15)
    for d, p, c, k, s in _grid_shapes(budget_packed=False)[::7]:
        ctx_ = d * c + p + k * s
        ch = [(p // k, s)] * k if p else None
        assert new.step_time(d, p, ctx_, ch) == pytest.approx(old.step_time(d, p, ctx_, ch), rel=1e-9)
    for d, chunks_ in ((8, [(256, 0)]), (40, [(256, 256)]), (100, [(256, 0)]), (0, [(512, 0)] * 2)):
        p = sum(n for n, _ in chunks_)
        ctx_ = d * 580 + p + sum(st for _, st in chunks_)
        assert new.step_time(d, p, ctx_, chunks_) == pytest.approx(old.step_time(d, p, ctx_, chunks_), rel=1e-9)


def test_which_points_stay_out_of_the_regression():
    """Budget points: decodes beside more prefill tokens, in k > 1 prompts from position 0, than any
    single-chunk point with decodes holds. The same shape as one chunk is a grid point (fitted);
    the committed H200 profiles have none (their packed points with decodes stop at 1,024)."""
    shapes = _grid_shapes()
    pts, times = [], []
    for d, p, c, k, s in shapes:
        ctx = d * c + p + k * s
        pts.append((d, p, ctx, k if p else 0, s))
        times.append(_law(d, [(p // k, s)] * k if p else [], ctx))
    assert ProfileCost(np.array(pts, dtype=float), np.array(times)).num_budget_points == 1
    pts1 = [x if x[:2] != (64, 1984) else (64, 1984, x[2], 1, 0) for x in pts]
    assert ProfileCost(np.array(pts1, dtype=float), np.array(times)).num_budget_points == 0
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "bench/results"
    for rel in ("fidelity_grid_h200_s16/6.7b-fp8/profile_6.7b-fp8.json",
                "fidelity_grid_h200_s17/33b-fp8/profile_33b-fp8.json"):
        if (root / rel).is_file():
            assert ProfileCost.from_json(root / rel).num_budget_points == 0
