"""The front door's cache of checked sampling parameters (gateway.frontdoor.sampling_from_wire):
a hit must give exactly what checking the message again would, and nothing invalid is kept."""
from __future__ import annotations

import pytest

from gateway import frontdoor
from gateway.errors import APIError
from gateway.frontdoor import _check_wire_sampling, sampling_from_wire
from gateway.validation import LIMITS, RequestLimits
from proto import tidegate_pb2 as pb


@pytest.fixture(autouse=True)
def empty_cache():
    frontdoor._sampling_cache.clear()
    yield
    frontdoor._sampling_cache.clear()


def _wire(**fields) -> pb.SamplingParams:
    s = pb.SamplingParams(max_tokens=fields.pop("max_tokens", 8))
    stop = fields.pop("stop", ())
    s.stop.extend(stop)
    for k, v in fields.items():
        setattr(s, k, v)
    return s


@pytest.mark.parametrize("fields", [
    {}, {"temperature": 0.7, "top_p": 0.9}, {"seed": 0}, {"seed": 5, "top_k": 3},
    {"stop": ["\n", "END"], "min_tokens": 2}, {"logprobs": 3, "repetition_penalty": 1.2},
])
def test_a_hit_equals_a_fresh_check_and_differs_where_the_message_does(fields):
    first = sampling_from_wire(_wire(**fields))
    again = sampling_from_wire(_wire(**fields))
    assert again is first  # served from the cache
    assert again == _check_wire_sampling(_wire(**fields), LIMITS)
    other = sampling_from_wire(_wire(**fields, max_tokens=9))
    assert other.max_tokens == 9 and first.max_tokens == 8


def test_seed_zero_is_not_the_same_as_no_seed():
    """proto3 optional: a set zero serializes, so it must not hit the unseeded entry."""
    assert sampling_from_wire(_wire()).seed is None
    assert sampling_from_wire(_wire(seed=0)).seed == 0


def test_invalid_parameters_fail_every_time_and_are_not_cached():
    bad = _wire(temperature=-1.0)
    for _ in range(2):
        with pytest.raises(APIError) as err:
            sampling_from_wire(bad)
        assert err.value.status == 400
    assert not frontdoor._sampling_cache


def test_the_limits_are_part_of_the_key():
    """A gateway with a lower stop-string limit refuses what the default one accepted."""
    wire = _wire(stop=["a", "b", "c"])
    assert sampling_from_wire(wire).stop == ("a", "b", "c")
    with pytest.raises(APIError):
        sampling_from_wire(wire, RequestLimits(max_stop_strings=2))


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(frontdoor, "SAMPLING_CACHE_SIZE", 4)
    for seed in range(10):
        assert sampling_from_wire(_wire(seed=seed)).seed == seed
        assert len(frontdoor._sampling_cache) <= 4
