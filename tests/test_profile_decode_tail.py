"""Issue 35, session 17 (H35Q): with `ProfileCost(decode_extrapolation="slope")` (opt-in) decode-only
steps past the profile's largest decode batch follow the last measured bucket's line in d, not the
regression's slope plus the nearest point's residual ("nearest", the default). Closed forms on a
small synthetic profile."""
import numpy as np
import pytest

from sims.profile_cost import ProfileCost, _decode_tail

BUCKETS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]


def _decode(d, c):
    """Decode-only step (s): 3 ms + 0.05 ms a sequence + 0.1 us a context token, linear in d."""
    return 3e-3 + 5e-5 * d + 1e-7 * d * c


def _mixed(d, c, p):
    """Steps with prefill: a steeper slope in d (the mixed graph), which pulls the one regression."""
    return 6e-3 + 1.5e-4 * d + 1e-7 * d * c + 2e-5 * p


def _cost(mode="slope", ds=(1, 8, 16, 17, 32, 33, 48, 49, 64), buckets=BUCKETS):
    pts, times = [], []
    for c in (500, 600):
        for d in ds:
            pts.append((d, 0, d * c))
            times.append(_decode(d, c))
            for p in (256, 512):
                pts.append((d, p, d * c + p))
                times.append(_mixed(d, c, p))
    for p in (256, 512):
        pts.append((0, p, p))
        times.append(_mixed(0, 0, p))
    return ProfileCost(np.array(pts, dtype=float), np.array(times), ctx_quantum=1,
                       decode_buckets=buckets, decode_extrapolation=mode)


def test_the_tail_is_the_last_buckets_smallest_measured_batch_and_the_largest():
    d = np.array([0, 1, 8, 16, 17, 32, 33, 48, 49, 50, 64], dtype=float)
    assert _decode_tail(d, BUCKETS) == (49, 64)
    assert _decode_tail(d, None) == (50, 64)  # no buckets: the batch below the largest
    assert _decode_tail(np.array([1, 8, 16, 32, 64.0]), BUCKETS) == (32, 64)  # alone in its bucket
    assert _decode_tail(np.array([0, 64.0]), BUCKETS) is None


@pytest.mark.parametrize("d", [70, 80, 100, 128])
def test_past_the_largest_batch_a_decode_step_follows_the_last_buckets_line(d):
    slope, near = _cost("slope"), _cost("nearest")
    c = 550
    # the law is linear in d at a fixed context per sequence: the line through 49 and 64 is exact
    assert slope.step_time(d, 0, d * c) == pytest.approx(_decode(d, c), rel=1e-9)
    # the model before took the regression's slope in d (pulled by the mixed points): over
    assert near.step_time(d, 0, d * c) > _decode(d, c) * 1.01


def test_inside_the_measured_batches_and_steps_with_prefill_nothing_changes():
    slope, near = _cost("slope"), _cost("nearest")
    for d, p, c in ((1, 0, 500), (40, 0, 550), (64, 0, 600), (64, 0, 550), (100, 256, 550), (20, 512, 500)):
        assert slope.step_time(d, p, d * c + p) == near.step_time(d, p, d * c + p)


def test_one_measured_decode_batch_has_no_line_and_a_bad_mode_is_refused():
    one = _cost("slope", ds=(8,))
    near = _cost("nearest", ds=(8,))
    assert one.step_time(100, 0, 100 * 500) == near.step_time(100, 0, 100 * 500)
    with pytest.raises(ValueError, match="decode_extrapolation"):
        _cost("linear")


def test_nearest_is_the_default():
    pts = np.array([(1, 0, 500), (8, 0, 4000), (64, 0, 32000), (8, 256, 4256), (0, 256, 256)], dtype=float)
    times = np.array([_decode(1, 500), _decode(8, 500), _decode(64, 500), _mixed(8, 500, 256),
                      _mixed(0, 0, 256)])
    default = ProfileCost(pts, times, ctx_quantum=1)
    near = ProfileCost(pts, times, ctx_quantum=1, decode_extrapolation="nearest")
    assert default.step_time(100, 0, 50000) == near.step_time(100, 0, 50000)


def test_the_loads_rates_stay_those_of_the_best_batch_up_to_64():
    # the validate's grid measures decode batches to 128 (issue 35 s17); the capacity estimate, the
    # loads' unit, still takes the best batch up to 64 unless told otherwise
    from bench.simulator import validate
    doc = {"points": [{"num_decode_seqs": d} for d in (0, 1, 64, 128)]}
    assert validate.capacity_batch_limit(doc) == 64
    assert validate.capacity_batch_limit(doc, 0) == 128 and validate.capacity_batch_limit(doc, 256) == 128
    assert validate.capacity_batch_limit({"points": [{"num_decode_seqs": d} for d in (0, 8, 32)]}) == 32
    assert validate.profile_grid(512, 128)["decode_batch_sizes"] == "0,1,2,4,8,16,32,64,128"
    assert validate.profile_grid(512, 128, max_num_seqs=64)["decode_batch_sizes"] == "0,1,2,4,8,16,32,64"
