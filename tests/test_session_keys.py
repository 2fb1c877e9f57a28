"""Which session a request belongs to (gateway.sessions): precedence of prompt_cache_key, the
coding agents' headers, Anthropic's metadata and user; cache_control TTLs; the Anthropic
breakpoint cut."""
import pytest

from gateway.errors import APIError
from gateway.sessions import parse_cache_control, session_key, truncated_body


def test_precedence():
    h = {"x-claude-code-session-id": "cc", "session_id": "codex"}
    assert session_key(h, {"prompt_cache_key": "k", "user": "u"}) == "k:k"
    assert session_key(h, {"user": "u"}) == "h:cc"
    assert session_key({"session_id": "codex"}, {}) == "h:codex"
    assert session_key({"conversation_id": "c"}, {}) == "h:c"
    assert session_key({"x-session-affinity": "oc"}, {}) == "h:oc"
    assert session_key({}, {"metadata": {"user_id": "user_ab_account__session_123"}}) == "h:123"
    assert session_key({}, {"metadata": {"user_id": "alice"}}) == "u:alice"
    assert session_key({}, {"user": "bob"}) == "u:bob"
    assert session_key({}, {}) is None
    with pytest.raises(APIError) as e:
        session_key({}, {"prompt_cache_key": 7})
    assert e.value.status == 400


@pytest.mark.parametrize("value,seconds", [({"type": "ephemeral"}, 300.0),
                                           ({"type": "ephemeral", "ttl": "1h"}, 3600.0),
                                           ({"ttl": "90s"}, 90.0), ({"ttl": "2.5m"}, 150.0)])
def test_ttl(value, seconds):
    assert parse_cache_control(value, "cache_control") == seconds


@pytest.mark.parametrize("value", [{"ttl": "2h"}, {"ttl": "0s"}, {"ttl": 5}, {"type": "x"},
                                   "5m", {"ttl": "5m", "scope": "global"}])
def test_bad_ttl_is_a_400(value):
    with pytest.raises(APIError) as e:
        parse_cache_control(value, "cache_control")
    assert e.value.status == 400 and e.value.param.startswith("cache_control")


def test_breakpoint_cut():
    body = {"system": [{"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": "c"}]}
    cut = truncated_body(body, "messages", 0, 0)
    assert cut["messages"] == [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    assert body["messages"][0]["content"][1]["text"] == "b"  # the body is not changed
    assert truncated_body(body, "system", 0, 0)["messages"] == []
