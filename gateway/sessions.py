"""Agent sessions at the gateway (issue 30): which session a request belongs to, and its pin.

A request's session key, first found wins:

1. OpenAI's ``prompt_cache_key`` (the field OpenAI routes its own prompt cache by; Codex sends
   its conversation id there).
2. A coding agent's session header:
   ``x-claude-code-session-id`` (Claude Code sends ``X-Claude-Code-Session-Id`` with every API
   request since 2.1.86: kirocc v0.0.8 release notes, github.com/d-kuro/kirocc),
   ``session_id`` / ``session-id`` and ``conversation_id`` / ``conversation-id`` (Codex: its
   Responses client's session and conversation ids, the "Session_id (Codex)" of CLIProxyAPI's
   session-affinity list and cc-switch's ``extract_session_id``),
   ``x-session-affinity`` and ``x-opencode-session`` (OpenCode: ``x-session-affinity`` on every
   provider request, ``x-opencode-session`` its older name), then the generic ``x-session-id``.
3. Anthropic's ``metadata.user_id`` when it carries Claude Code's ``..._session_<id>``.
4. ``user`` (OpenAI) / ``metadata.user_id`` (Anthropic).

With none, the placement finds the session from the prompt (`scheduler.sessions`: a prompt that
contains a whole earlier prompt continues it). The key is only a routing hint: it never crosses
to a backend and never changes what a request may see.

Pins: Anthropic's ``cache_control`` (``{"type": "ephemeral", "ttl": "5m" | "1h"}``) on a system,
tool or message block pins the prompt up to and including that block — the deepest breakpoint —
for its ``ttl`` (5 minutes by default); tidegate takes the same object as a top-level
``cache_control`` field of OpenAI completions and chat requests, pinning the whole prompt. A TTL
may also be given as ``"<N>s"``, ``"<N>m"`` or ``"<N>h"``, at most `MAX_PIN_TTL_S`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.body_checks import type_error
from gateway.errors import bad_request
from gateway.openai_schema import ServingOptions

SESSION_HEADERS = ("x-claude-code-session-id", "session_id", "session-id", "conversation_id",
                   "conversation-id", "x-session-affinity", "x-opencode-session", "x-session-id")
MAX_SESSION_KEY_CHARS = 256
MAX_PIN_TTL_S = 3600.0
DEFAULT_PIN_TTL_S = 300.0
_TTL = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smh])$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_cache_control(value: Any, param: str) -> float:
    """The pin TTL in seconds of a ``cache_control`` object (400 naming `param` if malformed)."""
    if not isinstance(value, dict):
        raise type_error(param, 'an object {"type": "ephemeral", "ttl": "5m"}', value)
    unknown = sorted(set(value) - {"type", "ttl"})
    if unknown:
        raise bad_request(f"Unknown field '{param}.{unknown[0]}'; 'cache_control' takes 'type' "
                          "and 'ttl'.", f"{param}.{unknown[0]}", "unknown_parameter")
    if value.get("type", "ephemeral") != "ephemeral":
        raise bad_request(f"'{param}.type' must be 'ephemeral'.", f"{param}.type")
    ttl = value.get("ttl", "5m")
    m = _TTL.match(ttl) if isinstance(ttl, str) else None
    if m is None:
        raise bad_request(f"'{param}.ttl' must be a duration such as '5m' or '1h', got {ttl!r}.",
                          f"{param}.ttl")
    seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if not 0 < seconds <= MAX_PIN_TTL_S:
        raise bad_request(f"'{param}.ttl' must be more than 0 and at most "
                          f"{MAX_PIN_TTL_S / 3600:g}h, got {ttl!r}.", f"{param}.ttl")
    return seconds


def _key(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise type_error(param, "a string", value)
    if len(value) > MAX_SESSION_KEY_CHARS:
        raise bad_request(f"'{param}' is longer than {MAX_SESSION_KEY_CHARS} characters.", param)
    return value or None


def check_prompt_cache_key(body: dict) -> None:
    """A body's `prompt_cache_key` is a string of at most MAX_SESSION_KEY_CHARS (else a 400 naming
    it): checked with the body's other fields, before the request is accepted."""
    _key(body.get("prompt_cache_key"), "prompt_cache_key")


def session_key(headers: Mapping[str, str], body: dict) -> str | None:
    """The request's session key (module docstring), or None."""
    key = _key(body.get("prompt_cache_key"), "prompt_cache_key")
    if key is not None:
        return "k:" + key
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return "h:" + value[:MAX_SESSION_KEY_CHARS]
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else body.get("user")
    if isinstance(user, str) and user:
        _, sep, session = user.partition("_session_")
        if sep and session:
            return "h:" + session[:MAX_SESSION_KEY_CHARS]
        return "u:" + user[:MAX_SESSION_KEY_CHARS]
    return None


def openai_options(options: ServingOptions, headers: Mapping[str, str],
                   body: dict) -> ServingOptions:
    """`options` with the session key and the top-level ``cache_control`` pin (whole prompt)."""
    ttl = 0.0
    if body.get("cache_control") is not None:
        ttl = parse_cache_control(body["cache_control"], "cache_control")
    return replace(options, session_key=session_key(headers, body), pin_ttl_s=ttl)


# ---- Anthropic: where the deepest cache_control breakpoint is ------------------------------------
def _breakpoint(body: dict) -> tuple[str, int, int, float] | None:
    """(where, message index, block index, ttl) of the deepest ``cache_control``: where is
    'tools', 'system' or 'messages'; None without one."""
    found = None
    tools = body.get("tools")
    if isinstance(tools, list):
        for j, tool in enumerate(tools):
            if isinstance(tool, dict) and tool.get("cache_control") is not None:
                found = ("tools", 0, j, parse_cache_control(tool["cache_control"],
                                                            f"tools.{j}.cache_control"))
    system = body.get("system")
    if isinstance(system, list):
        for j, block in enumerate(system):
            if isinstance(block, dict) and block.get("cache_control") is not None:
                found = ("system", 0, j, parse_cache_control(block["cache_control"],
                                                             f"system.{j}.cache_control"))
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, msg in enumerate(messages):
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, list):
                for j, block in enumerate(content):
                    if isinstance(block, dict) and block.get("cache_control") is not None:
                        found = ("messages", i, j, parse_cache_control(
                            block["cache_control"], f"messages.{i}.content.{j}.cache_control"))
    return found


def truncated_body(body: dict, where: str, i: int, j: int) -> dict:
    """The request body cut just after the breakpoint's block (what Anthropic caches)."""
    if where == "messages":
        msgs = [dict(m) for m in body["messages"][:i + 1]]
        msgs[-1]["content"] = msgs[-1]["content"][:j + 1]
        return {**body, "messages": msgs}
    if where == "system":
        return {**body, "system": body["system"][:j + 1], "messages": []}
    return {**body, "system": None, "messages": []}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


async def anthropic_options(options: ServingOptions, headers: Mapping[str, str], body: dict,
                            prompt_ids: list[int], render) -> ServingOptions:
    """`options` with the session key and the deepest breakpoint's pin: the prompt's tokens up
    to it, found by rendering the body cut there (`render(body) -> ids`, the chat template) and
    taking what it shares with the whole prompt. A cut the template cannot render (or none)
    pins the whole prompt."""
    key = session_key(headers, body)
    bp = _breakpoint(body)
    if bp is None:
        return replace(options, session_key=key)
    where, i, j, ttl = bp
    tokens = 0
    try:
        ids = await render(truncated_body(body, where, i, j))
        tokens = common_prefix(ids, prompt_ids)
    except Exception:  # noqa: BLE001 -- a cut that does not parse alone: the whole prompt
        tokens = 0
    if tokens >= len(prompt_ids):
        tokens = 0
    return replace(options, session_key=key, pin_ttl_s=ttl, pin_tokens=tokens)


def session_from_wire(req) -> dict:
    """ServingOptions fields of a front-door GenerateRequest's session key and pin (the ZMQ
    client's session_key / pin_ttl_s / pin_tokens), checked as HTTP's are."""
    out: dict = {}
    if req.session_key:
        out["session_key"] = "k:" + _key(req.session_key, "session_key")
    if req.pin_ttl_s:
        if not 0 < req.pin_ttl_s <= MAX_PIN_TTL_S:
            raise bad_request(f"'pin_ttl_s' must be more than 0 and at most {MAX_PIN_TTL_S:g}, "
                              f"got {req.pin_ttl_s:g}.", "pin_ttl_s")
        out["pin_ttl_s"] = float(req.pin_ttl_s)
        out["pin_tokens"] = int(req.pin_tokens)
    return out


PIN_STATUS_NAMES = {1: "pinned", 2: "over_budget", 3: "unsupported"}
