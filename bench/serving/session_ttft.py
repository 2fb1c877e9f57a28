"""Issue 30's H200 goal: TTFT of a long session's cached follow-up turns vs recomputing them.

    python -m bench.serving.session_ttft --url http://127.0.0.1:8000 --context 16384 \\
        --turns 8 --repeats 3 [--pin-ttl-s 300] [--pressure-tokens 200000] --json out.json

One session (a session header, token-id prompts) grows turn by turn to `--context` tokens; each
turn's prompt is the previous one plus new tokens, so the server holds all but the new part.
Each turn is followed by a *cold* twin: a prompt of the same length whose ids share nothing with
anything sent (every token recomputed). Requests go one at a time (no load): the TTFT ratio
cold / cached per turn is what the prefix cache (or, with `--pressure-tokens` and a host tier,
the host tier, or with `--pin-ttl-s` a pin) saves. `--pressure-tokens`: unrelated prompts of
that many tokens in all are sent between a turn and its follow-up (evicting what is not pinned;
the follow-up then finds its prefix pinned, in host memory, or recomputes it).

TTFT is the time to the first chunk that carries a generated token (`return_token_ids`, counted
as `bench.serving.loadgen` counts them), not to the first chunk with text: a server streams no
chunk for a token whose text is empty or held back (our gateway; a preset model's byte-level
tokenizer gives no text to ids >= 259, so with the 33B preset the first text came with the last
of the `--max-tokens` tokens and every TTFT carried 15 decode steps, ~270 ms on the H200).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import aiohttp

from bench.serving.loadgen import _sse_lines, chunk_tokens


async def _ttft(session, url, model, ids, max_tokens, headers, body_extra) -> tuple[float, dict]:
    """(ms to the first generated token, the final usage with `e2e_ms` (ms to the end) and
    `text_ms` (ms to the first chunk with text or a finish reason: what the first chunk would
    have been without return_token_ids, this client's TTFT before 2026-12-04) added)."""
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True, **body_extra}
    t0 = time.perf_counter()
    first = text = None
    usage = {}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {(await resp.text())[:300]}")
        async for now, line in _sse_lines(resp):  # (the prompt echo is one long line)
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if first is None and sum(chunk_tokens(c) for c in chunk.get("choices") or ()):
                first = now
            if text is None and any(c.get("text") or c.get("finish_reason")
                                    for c in chunk.get("choices") or ()):
                text = now
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    return ((first or end) - t0) * 1e3, {**usage, "e2e_ms": (end - t0) * 1e3,
                                         "text_ms": ((text or end) - t0) * 1e3}


async def run(a: argparse.Namespace) -> dict:
    rng = random.Random(a.seed)
    lo, hi = 3, a.vocab

    def fresh(n: int) -> list[int]:
        return [rng.randrange(lo, hi) for _ in range(n)]

    step = (a.context - a.max_tokens - a.first_tokens) // max(1, a.turns - 1)
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=a.timeout)) as s:
        async with s.get(a.url + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
        await _ttft(s, a.url, model, fresh(64), 2, {}, {})  # warm-up
        for rep in range(a.repeats):
            prompt = fresh(a.first_tokens)
            headers = {"x-claude-code-session-id": f"session-{a.seed}-{rep}"}
            extra = {"cache_control": {"type": "ephemeral", "ttl": f"{a.pin_ttl_s:g}s"}} \
                if a.pin_ttl_s else {}
            for turn in range(a.turns):
                if turn:
                    prompt = prompt + fresh(step)
                    if a.pressure_tokens:
                        sent = 0
                        while sent < a.pressure_tokens:
                            n = min(a.context - a.max_tokens, a.pressure_tokens - sent)
                            await _ttft(s, a.url, model, fresh(n), 1, {}, {})
                            sent += n
                ttft, usage = await _ttft(s, a.url, model, prompt, a.max_tokens, headers, extra)
                cold, cold_usage = await _ttft(s, a.url, model, fresh(len(prompt)), a.max_tokens,
                                               {}, {})
                cached = usage.get("prompt_tokens_details", {}).get("cached_tokens")
                rows.append({"repeat": rep, "turn": turn, "prompt_tokens": len(prompt),
                             "cached_tokens": cached, "pin": usage.get("pin"),
                             "ttft_ms": ttft, "cold_ttft_ms": cold, "e2e_ms": usage["e2e_ms"],
                             "cold_e2e_ms": cold_usage["e2e_ms"], "text_ms": usage["text_ms"],
                             "cold_text_ms": cold_usage["text_ms"]})
                print(f"rep {rep} turn {turn}: {len(prompt)} tokens, cached {cached}, TTFT "
                      f"{ttft:.1f} ms vs cold {cold:.1f} ms (first text {usage['text_ms']:.1f} vs "
                      f"{cold_usage['text_ms']:.1f} ms; end {usage['e2e_ms']:.1f} vs "
                      f"{cold_usage['e2e_ms']:.1f} ms)", file=sys.stderr)
    follow = [r for r in rows if r["turn"] > 0]
    p50 = statistics.median(r["ttft_ms"] for r in follow)
    cold_p50 = statistics.median(r["cold_ttft_ms"] for r in follow)
    text_p50 = statistics.median(r["text_ms"] for r in follow)
    cold_text_p50 = statistics.median(r["cold_text_ms"] for r in follow)
    return {"context": a.context, "turns": a.turns, "repeats": a.repeats,
            "max_tokens": a.max_tokens, "pressure_tokens": a.pressure_tokens,
            "pin_ttl_s": a.pin_ttl_s,
            "followup_ttft_p50_ms": p50, "recompute_ttft_p50_ms": cold_p50,
            "speedup": cold_p50 / p50 if p50 else None,
            # the same requests timed to their first chunk with text (the old definition)
            "followup_text_p50_ms": text_p50, "recompute_text_p50_ms": cold_text_p50,
            "text_speedup": cold_text_p50 / text_p50 if text_p50 else None, "rows": rows}


def predict(a: argparse.Namespace) -> dict:
    """The same session through a measured step-time profile (`--predict PROFILE`, no server):
    each turn's uncached part prefilled in chunks of `--chunk` tokens after its cached part, vs
    the whole prompt cold. Queue-free, delivery path not included."""
    from sims.profile_cost import ProfileCost
    cost = ProfileCost.from_json(a.predict)
    step = (a.context - a.max_tokens - a.first_tokens) // max(1, a.turns - 1)

    def prefill_s(new: int, start: int) -> float:
        t = done = 0
        while done < new:
            n = min(a.chunk, new - done)
            t += cost.step_time(0, n, start + done + n)
            done += n
        return t

    rows = []
    for turn in range(1, a.turns):
        length = a.first_tokens + step * turn
        cached = (a.first_tokens + step * (turn - 1)) // a.block_size * a.block_size
        rows.append({"turn": turn, "prompt_tokens": length, "cached_tokens": cached,
                     "ttft_ms": prefill_s(length - cached, cached) * 1e3,
                     "cold_ttft_ms": prefill_s(length, 0) * 1e3})
    p50 = statistics.median(r["ttft_ms"] for r in rows)
    cold = statistics.median(r["cold_ttft_ms"] for r in rows)
    return {"predicted_from": a.predict, "context": a.context, "turns": a.turns,
            "followup_ttft_p50_ms": p50, "recompute_ttft_p50_ms": cold, "speedup": cold / p50,
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.session_ttft", description=__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--context", type=int, default=16384, help="the last turn's prompt + output")
    p.add_argument("--first-tokens", type=int, default=2048)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--pin-ttl-s", type=float, default=0.0)
    p.add_argument("--pressure-tokens", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--predict", default=None, metavar="PROFILE",
                   help="no server: the prediction of a measured step-time profile")
    p.add_argument("--chunk", type=int, default=2048, help="prefill tokens per step (--predict)")
    p.add_argument("--block-size", type=int, default=16)
    a = p.parse_args(argv)
    out = predict(a) if a.predict else asyncio.run(run(a))
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0 if out["speedup"] else 1


if __name__ == "__main__":
    sys.exit(main())
