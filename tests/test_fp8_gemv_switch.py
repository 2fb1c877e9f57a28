"""`--fp8-gemv-max-m` (session 39): the rows up to which an fp8 linear runs the weight-only GEMV before
per-token fp8 + torch._scaled_mm. Every FP8 profile shows decode steps of 17-32 sequences slower on the
GEMV than the 48-row graph on _scaled_mm (bench/results/pairs_s39, section 2); the switch is a serving
option so that a service (and its profile) can run either, and says which in its ready line."""
import pytest
import torch

from backend.engine.assemble import BackendConfig, ServingOptions, build_runner
from backend.errors import ModelLoadError
from backend.kernels import fp8_gemv


@pytest.fixture
def paths(monkeypatch):
    """fp8_linear's dispatch with its two CUDA paths recorded instead of run (on the CPU neither can)."""
    taken = []
    monkeypatch.setattr(fp8_gemv, "use_triton", lambda x: True)
    monkeypatch.setattr(fp8_gemv, "_scaled_mm_ok", lambda x, w: True)
    monkeypatch.setattr(fp8_gemv, "fp8_gemv_triton",
                        lambda x, w, s: taken.append(("gemv", x.shape[0])) or torch.zeros(x.shape[0], w.shape[0]))
    monkeypatch.setattr(fp8_gemv, "fp8_scaled_mm",
                        lambda x, w, s: taken.append(("scaled_mm", x.shape[0])) or torch.zeros(x.shape[0], w.shape[0]))
    monkeypatch.setattr(fp8_gemv, "FP8_GEMV_MAX_M", fp8_gemv.FP8_GEMV_MAX_M)  # restored after the test
    return taken


def _rows(m):
    w = torch.zeros(8, 16).to(fp8_gemv.FP8_DTYPE)
    fp8_gemv.fp8_linear(torch.zeros(m, 16), w, torch.ones(8))


def test_the_switch_sends_each_graph_bucket_to_its_path(paths):
    # the default since session 41 (measured through the service: bench/results/pairs_s41)
    assert fp8_gemv.FP8_GEMV_MAX_M == 16
    for m in (16, 24, 32, 48):  # decode graph buckets: the 24- and 32-row graphs are the ones that move
        _rows(m)
    assert paths == [("gemv", 16), ("scaled_mm", 24), ("scaled_mm", 32), ("scaled_mm", 48)]
    paths.clear()
    fp8_gemv.set_gemv_max_m(32)  # the earlier default, kept as a flag value for cached profiles
    for m in (16, 24, 32, 48):
        _rows(m)
    assert paths == [("gemv", 16), ("gemv", 24), ("gemv", 32), ("scaled_mm", 48)]


@pytest.mark.parametrize("bad", [-1, 2.5, "16", True])
def test_a_bad_switch_is_refused(paths, bad):
    with pytest.raises(ValueError, match="fp8_gemv_max_m must be an integer >= 0"):
        fp8_gemv.set_gemv_max_m(bad)
    assert fp8_gemv.FP8_GEMV_MAX_M == 16


def test_the_switch_without_fp8_weights_is_a_clear_error_before_loading(monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("loaded a model for a configuration that cannot serve")

    monkeypatch.setattr("backend.engine.assemble.load", no_load)
    with pytest.raises(ModelLoadError, match="--fp8-gemv-max-m applies to fp8 weights only"):
        build_runner(BackendConfig(model="tiny", device="cpu"), ServingOptions(fp8_gemv_max_m=16))


def test_the_serving_flag_reaches_the_engine_and_its_ready_line():
    import argparse

    from backend.server.cli import _serving_note, _serving_options
    from engine_flags import add_serving_args

    p = argparse.ArgumentParser()
    add_serving_args(p)
    opts = _serving_options(p.parse_args(["--quantization", "fp8", "--fp8-gemv-max-m", "16"]))
    assert opts.quantization == "fp8" and opts.fp8_gemv_max_m == 16
    assert _serving_options(p.parse_args([])).fp8_gemv_max_m is None
    assert _serving_note({"quantization": "fp8", "fp8_gemv_max_m": 16}) == ", fp8 weights, GEMV up to 16 rows"


def test_the_profiler_takes_the_switch():
    from bench.engine.profile import parser

    a = parser().parse_args(["--out", "x.json", "--quantization", "fp8", "--fp8-gemv-max-m", "16"])
    assert a.fp8_gemv_max_m == 16
