"""OpenAI response bodies: completions, chat completions, and their streaming chunks."""
from __future__ import annotations

import json
from typing import Any

from gateway.core import RequestHandle
from gateway.sessions import PIN_STATUS_NAMES


def usage(handles: list[RequestHandle], n: int = 1) -> dict[str, Any]:
    """OpenAI's count: each prompt once (handles are prompt-major, n choices per prompt), every
    choice's completion tokens. With a prediction, `completion_tokens_details` as OpenAI's
    Predicted Outputs give it: the prediction's tokens that appear in the output (accepted) and
    the rest (rejected), counted here (`RequestHandle.prediction_usage`)."""
    prompt = sum(len(h.prompt_ids) for h in handles[::n])
    completion = sum(len(h.assembler.token_ids) for h in handles)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if any(h.prediction_ids is not None for h in handles):
        counts = [h.prediction_usage() for h in handles]
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": sum(a for a, _ in counts),
            "rejected_prediction_tokens": sum(r for _, r in counts)}
    opts = handles[0].options
    if opts.session_key is not None or opts.pin_ttl_s > 0:
        # agent sessions (issue 30): the prompt tokens served from the prefix cache (as OpenAI's
        # prompt caching reports them), and what became of a `cache_control` pin
        out["prompt_tokens_details"] = {
            "cached_tokens": sum(h.cached_tokens for h in handles[::n])}
        if opts.pin_ttl_s > 0:
            out["pin"] = PIN_STATUS_NAMES.get(handles[0].pin_status, "unsupported")
    return out


def completion_logprobs(handle: RequestHandle, token_ids: list[int],
                        logprobs: list[tuple] | None, offset: int) -> dict[str, Any] | None:
    """OpenAI completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    num_top = handle.sampling.logprobs
    if num_top is None or logprobs is None:
        return None
    decode = handle.gateway.bundle.decode
    tokens = [decode([t]) for t in token_ids]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top = [{decode([i]): v for i, v in list(zip(ids, lps))[:num_top]} for _, ids, lps in logprobs]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _, _ in logprobs],
            "top_logprobs": top if num_top > 0 else None, "text_offset": offsets}


def completion_choice(index: int, handle: RequestHandle, prompt_text: str | None) -> dict:
    asm = handle.assembler
    text = (prompt_text or "") + asm.text if prompt_text is not None else asm.text
    choice: dict[str, Any] = {
        "index": index, "text": text,
        # with echo the text starts with the prompt: offsets count from the start of `text`
        "logprobs": completion_logprobs(handle, asm.token_ids, asm.logprobs or None,
                                        len(prompt_text or "")),
        "finish_reason": asm.finish_reason,
    }
    if handle.options.return_token_ids:
        choice["prompt_token_ids"] = list(handle.prompt_ids)
        choice["token_ids"] = list(asm.token_ids)
    return choice


def completion_body(request_id: str, created: int, model: str, choices: list[dict],
                    handles: list[RequestHandle], n: int = 1) -> dict:
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": usage(handles, n)}


def chat_choice(index: int, handle: RequestHandle, echo: str = "") -> dict[str, Any]:
    asm = handle.assembler
    choice: dict[str, Any] = {
        "index": index, "message": {"role": "assistant", "content": echo + asm.text},
        "logprobs": chat_logprobs(handle, asm.token_ids, asm.logprobs or None),
        "finish_reason": asm.finish_reason,
    }
    if handle.options.return_token_ids:
        choice["prompt_token_ids"] = list(handle.prompt_ids)
        choice["token_ids"] = list(asm.token_ids)
    return choice


def chat_body(request_id: str, created: int, model: str, handles: list[RequestHandle],
              n: int = 1, echo: str = "") -> dict:
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [chat_choice(i, h, echo) for i, h in enumerate(handles)],
            "usage": usage(handles, n)}


def chat_logprobs(handle: RequestHandle, token_ids: list[int],
                  logprobs: list[tuple] | None) -> dict[str, Any] | None:
    """OpenAI chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    num_top = handle.sampling.logprobs
    if num_top is None or logprobs is None:
        return None
    decode = handle.gateway.bundle.decode

    def entry(token_id: int, lp: float) -> dict[str, Any]:
        text = decode([token_id])
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for t, (lp, ids, lps) in zip(token_ids, logprobs):
        e = entry(t, lp)
        e["top_logprobs"] = [entry(i, v) for i, v in list(zip(ids, lps))[:num_top]]
        content.append(e)
    return {"content": content}


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


DONE = b"data: [DONE]\n\n"
