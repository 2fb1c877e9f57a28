"""The simulator's per-step records expanded at the end of a run (sims.event_loop.expand_steps):
every step's duration equals the cost model's own per-step figure, bit for bit, whether the
stretch segments are all distinct or repeat (then each kind is computed once and gathered)."""
import numpy as np
import pytest

from sims.cost import ConstantCost, RooflineCost
from sims.event_loop import expand_steps
from sims.hardware import get_gpu
from sims.model_shape import load_model_shape

ROOFLINE = RooflineCost(load_model_shape("deepseek-coder-6.7b"), get_gpu("h200"))


def _reference(cost, step_rows, stretch_rows):
    """One segment at a time through decode_times (the per-call formula), then concatenated."""
    decode = [r[0] for r in step_rows]
    prefill = [r[1] for r in step_rows]
    times = [np.array([r[2] for r in step_rows], dtype=np.float64)]
    for k, n, ctx in stretch_rows:
        decode += [n] * k
        prefill += [0] * k
        times.append(cost.decode_times(n, ctx, k))
    return np.array(decode), np.array(prefill), np.concatenate(times)


def _segments(rng, num, kinds):
    """`num` segments drawn from `kinds` distinct (steps, batch, first context) triples."""
    pool = [(int(rng.integers(1, 300)), int(rng.integers(1, 200)), int(rng.integers(1, 50_000)))
            for _ in range(kinds)]
    return [pool[i] for i in rng.integers(0, kinds, num)]


@pytest.mark.parametrize("kinds", [1, 7, 400])  # 400 of 500: too many kinds to gather
@pytest.mark.parametrize("cost", [ROOFLINE, ConstantCost(0.004)], ids=["roofline", "constant"])
def test_every_step_has_the_cost_models_own_duration(cost, kinds):
    rng = np.random.default_rng(kinds)
    step_rows = [(int(rng.integers(0, 64)), int(rng.integers(1, 2048)), float(rng.random()))
                 for _ in range(50)]
    stretch_rows = _segments(rng, 500, kinds)
    got = expand_steps(cost, step_rows, stretch_rows)
    want = _reference(cost, step_rows, stretch_rows)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_no_stretches_and_no_single_steps():
    d, p, t = expand_steps(ROOFLINE, [(3, 0, 0.01)], [])
    assert (d.tolist(), p.tolist(), t.tolist()) == ([3], [0], [0.01])
    d, p, t = expand_steps(ROOFLINE, [], [(4, 1, 513)] * 3)
    assert d.tolist() == [1] * 12 and not p.any()
    np.testing.assert_array_equal(t, np.tile(ROOFLINE.decode_times(1, 513, 4), 3))
