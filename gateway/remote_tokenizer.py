"""Tokenizing through the OpenAI-compatible server behind the gateway, when the gateway has no
tokenizer of its own (`tidegate serve --backend http://…` without `--tokenizer`).

vLLM's servers and ours answer the same two routes, and the gateway asks them:

    text prompt        POST /tokenize   {"model", "prompt", "add_special_tokens"}   → {"tokens"}
    chat messages      POST /tokenize   {"model", "messages", "add_generation_prompt",
                                         "add_special_tokens"}                      → {"tokens"}
    token ids (echo)   POST /detokenize {"model", "tokens"}                         → {"prompt"}

So the ids are exactly those the server would make of the text itself (its vocabulary, its
chat template), the queues, placement and usage see real token counts, and the server is sent
token ids as before. The generated text comes back with the tokens (`RequestOutput.text`, set
by `gateway.http_backend`). A 4xx from the server is the client's 400, another failure a 502, no answer a 503.
"""
from __future__ import annotations

import asyncio

import aiohttp

from gateway.errors import backend_error, bad_request, unavailable


class RemoteTokenizer:
    """/tokenize and /detokenize of the pool's healthy HTTP backends (each call asks one)."""

    def __init__(self, pool) -> None:
        self.pool = pool  # gateway.backend_pool.BackendPool
        self._turn = 0

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        reply = await self._post("/tokenize", {"prompt": text,
                                               "add_special_tokens": add_special_tokens}, "prompt")
        return _ids(reply.get("tokens"), "/tokenize")

    async def encode_chat(self, messages: list[dict], add_generation_prompt: bool,
                          add_special_tokens: bool) -> list[int]:
        reply = await self._post("/tokenize", {"messages": messages,
                                               "add_generation_prompt": add_generation_prompt,
                                               "add_special_tokens": add_special_tokens},
                                 "messages")
        return _ids(reply.get("tokens"), "/tokenize")

    async def decode(self, ids: list[int]) -> str:
        reply = await self._post("/detokenize", {"tokens": list(ids)}, "prompt")
        text = reply.get("prompt")
        if not isinstance(text, str):
            raise unavailable("The backend's /detokenize answered without a 'prompt'.")
        return text

    async def tokenize_request(self, body: dict, param: str) -> dict:
        """A whole /tokenize request, answered by the server (the gateway's own /tokenize)."""
        return await self._post("/tokenize", body, param)

    def _server(self):
        servers = [b for b in self.pool.backends
                   if b.healthy and getattr(b, "session", None) is not None]
        if not servers:
            raise unavailable("No healthy backend can tokenize the prompt.")
        self._turn += 1
        return servers[self._turn % len(servers)]

    async def _post(self, path: str, body: dict, param: str) -> dict:
        conn = self._server()
        body = {"model": conn.info.model if conn.info is not None else None, **body}
        try:
            async with conn.session.post(f"{conn.address}{path}", json=body) as resp:
                try:
                    reply = await resp.json(content_type=None)
                except ValueError:
                    reply = None
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise unavailable(f"The backend's {path} did not answer: {type(exc).__name__}.") \
                from None
        if status == 200 and isinstance(reply, dict):
            return reply
        message = _error_message(reply) or f"HTTP {status}"
        if 400 <= status < 500 and status not in (401, 403, 429):
            raise bad_request(f"The backend could not tokenize the request: {message}", param)
        raise backend_error(f"The backend's {path} failed: {message}")


def _ids(tokens, path: str) -> list[int]:
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise unavailable(f"The backend's {path} answered without a list of token ids.")
    return tokens


def _error_message(reply) -> str:
    """The message of an error body: OpenAI's {"error": {"message"}} or vLLM's {"message"}."""
    if not isinstance(reply, dict):
        return ""
    err = reply.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"][:300]
    return str(reply.get("message") or "")[:300]
