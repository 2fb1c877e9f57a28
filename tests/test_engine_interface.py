"""Every engine the worker can serve implements `backend.engine.interface.ServingEngine` (issue
26): ours, echo and vLLM's, checked as classes (vLLM's is not importable without vLLM, but its
module is) and, for ours and echo, as live objects whose load figures follow the requests."""
from __future__ import annotations

import inspect

import pytest

from backend.engine import echo, vllm
from backend.engine.continuous import Engine
from backend.engine.interface import REQUIRED, EngineLoad, ServingEngine, missing_members
from backend.runner.sampler import SamplingParams

ENGINE_CLASSES = [Engine, echo.EchoEngine, vllm.VllmEngine]


@pytest.mark.parametrize("cls", ENGINE_CLASSES, ids=lambda c: c.__name__)
def test_each_engine_class_declares_every_member_of_the_contract(cls):
    members = dict(inspect.getmembers(cls))
    # instance attributes set in __init__ are not on the class: read them off the source
    init_src = inspect.getsource(cls.__init__)
    missing = [m for m in REQUIRED if m not in members and f"self.{m} =" not in init_src]
    assert not missing, f"{cls.__name__} lacks {missing}"
    for name in ("add_request", "abort", "step", "advance", "settle", "launch_deadline", "load",
                 "prefix_cache_probe", "check_integrity", "has_unfinished"):
        assert callable(members[name]), f"{cls.__name__}.{name} is not a method"


def _echo_engine():
    from backend.engine.assemble import BackendConfig

    cfg = BackendConfig(model="echo", num_blocks=64, max_model_len=256)
    engine, _ = echo.create_echo_engine(cfg)
    return engine


def _our_engine():
    from backend.engine.assemble import BackendConfig, create_engine

    cfg = BackendConfig(model="tiny", load_format="dummy", device="cpu", dtype="float32",
                        num_blocks=64, max_model_len=256, enable_prefix_caching=True)
    engine, _ = create_engine(cfg)
    return engine


@pytest.mark.parametrize("make", [_echo_engine, _our_engine], ids=["echo", "ours"])
def test_live_engines_report_their_load_through_the_interface(make):
    engine = make()
    assert isinstance(engine, ServingEngine) and missing_members(engine) == []
    idle = engine.load()
    assert isinstance(idle, EngineLoad)
    assert idle.num_free_blocks == idle.num_total_blocks == engine.config.num_blocks
    assert engine.add_request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=4)) is None
    assert engine.add_request("b", [5, 6, 7], SamplingParams(max_tokens=6)) is None
    assert engine.load().num_outstanding_tokens == 10
    finished = set()
    while engine.has_unfinished():
        outs = engine.advance() if engine.overlaps_device else engine.step()
        mid = engine.load()
        assert mid.num_free_blocks < mid.num_total_blocks or not engine.has_unfinished()
        finished |= {o.request_id for o in outs if o.finish_reason is not None}
    assert finished == {"a", "b"}
    done = engine.load()
    assert done.num_running == done.num_waiting == done.num_outstanding_tokens == 0
    assert done.num_free_blocks == done.num_total_blocks
    engine.check_integrity()
    assert engine.settle() == []


def test_the_prefix_probe_answers_only_where_the_engine_can():
    assert _echo_engine().prefix_cache_probe() is None
    assert callable(_our_engine().prefix_cache_probe())
