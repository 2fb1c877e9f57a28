"""Issue 35, session 17 (H35Q): the profile's device time, queued behind device work.

`backend profile --device-time on` times each point as the serving loop runs it (a spin kernel holds
the stream while the host launches; the live step log's CUDA events) and writes `device_ms_median`;
with `hide_launch` the cost model fits those instead of step minus launch (`fits_device_time`).
Profiles without the field, or with it on some points only, and models without `hide_launch`:
unchanged. Closed forms on small synthetic profiles."""
import json
import types

import numpy as np
import pytest

from bench.engine import profile
from sims.profile_cost import ProfileCost


def _device(d, p):
    """The step's device time (ms): 3 + 0.05 d + 0.01 p, a plane (the fit is exact: no residuals)."""
    return 3.0 + 0.05 * d + 0.01 * p


def _launch(d, p):
    return 0.4 + 0.002 * d + 0.001 * p


def _doc(device: str = "all", overlap_ms: float = 0.3):
    """A profile whose wall step is launch + device - overlap (the device ran `overlap_ms` of the
    step while the host launched: step - launch under-states the device time by that)."""
    pts = []
    for c in (100, 300):
        for d in (0, 1, 4, 16):
            for p in (0, 128, 512):
                if not d + p or (not d and c != 100):
                    continue
                pt = {"num_decode_seqs": d, "num_prefill_tokens": p, "context_len": c if d else 0,
                      "num_context_tokens": d * (c if d else 0) + p,
                      "step_ms": _launch(d, p) + _device(d, p) - overlap_ms,
                      "launch_ms_median": _launch(d, p)}
                if device == "all" or (device == "some" and p):
                    pt["device_ms_median"] = _device(d, p)
                pts.append(pt)
    return {"format": "tidegate-profile/1", "device": "cpu", "num_kv_blocks": 1024, "block_size": 16,
            "points": pts}


def _write(tmp_path, doc, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_the_model_fits_the_device_times_where_every_point_has_one(tmp_path):
    cost = ProfileCost.from_json(_write(tmp_path, _doc("all")), hide_launch=True, ctx_quantum=1)
    assert cost.fits_device_time and cost.describe()["fits_device_time"]
    for d, p in ((1, 0), (16, 0), (4, 128), (0, 512), (16, 512)):
        assert cost.step_time(d, p, d * 100 + p) * 1e3 == pytest.approx(_device(d, p), abs=1e-6)
    # the idle launch is the launch times' line, as without the device times
    old = ProfileCost.from_json(_write(tmp_path, _doc("none"), "o.json"), hide_launch=True, ctx_quantum=1)
    assert cost.launch_time(4, 128) == pytest.approx(old.launch_time(4, 128))
    assert cost.launch_time(4, 128) * 1e3 == pytest.approx(_launch(4, 128), abs=1e-6)
    # the old fit (step - launch) is short by exactly the overlap at every point
    for d, p in ((1, 0), (4, 128), (16, 512)):
        assert (cost.step_time(d, p, d * 100 + p) - old.step_time(d, p, d * 100 + p)) * 1e3 == \
            pytest.approx(0.3, abs=1e-6)


@pytest.mark.parametrize("device", ["none", "some"])
def test_without_device_times_on_every_point_the_fit_is_step_minus_launch(tmp_path, device):
    cost = ProfileCost.from_json(_write(tmp_path, _doc(device)), hide_launch=True, ctx_quantum=1)
    assert not cost.fits_device_time
    for d, p in ((1, 0), (4, 128), (16, 512)):
        assert cost.step_time(d, p, d * 100 + p) * 1e3 == pytest.approx(_device(d, p) - 0.3, abs=1e-6)


def test_without_hide_launch_the_device_times_are_not_used(tmp_path):
    cost = ProfileCost.from_json(_write(tmp_path, _doc("all")), ctx_quantum=1)
    assert not cost.fits_device_time
    for d, p in ((1, 0), (4, 128), (16, 512)):
        assert cost.step_time(d, p, d * 100 + p) * 1e3 == pytest.approx(
            _launch(d, p) + _device(d, p) - 0.3, abs=1e-6)


def test_device_times_must_match_the_points():
    pts = np.array([(1, 0, 100), (4, 0, 400), (0, 128, 128)], dtype=float)
    with pytest.raises(ValueError, match="device times"):
        ProfileCost(pts, np.array([4e-3, 5e-3, 6e-3]), launch_times_s=np.full(3, 4e-4),
                    hide_launch=True, device_times_s=np.array([3e-3, 4e-3]))


def test_the_profile_point_records_its_device_time():
    pt = profile.point(4, 128, 100, 1, 0, [5.0, 6.0, 7.0], [0.4, 0.5, 0.6], None, False, [4.0, 3.5, 4.5])
    assert pt["device_ms_median"] == 4.0 and pt["device_ms_min"] == 3.5
    pt = profile.point(4, 128, 100, 1, 0, [5.0, 6.0, 7.0], [0.4, 0.5, 0.6])
    assert "device_ms_median" not in pt and "device_ms_min" not in pt


def test_device_timing_needs_cuda():
    # the CPU runner has no timing events: no device time, the profile as before
    runner = types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"))
    assert profile.measure_device(runner, [], 3) is None


def test_the_profiler_times_the_device_by_default():
    args = profile.parser().parse_args(["--model", "tiny", "--out", "x.json"])
    assert args.device_time == "on"
    assert profile.parser().parse_args(["--model", "tiny", "--out", "x.json", "--device-time", "off"]
                                       ).device_time == "off"
