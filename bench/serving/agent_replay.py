"""`tidegate bench serve --agent-trace FILE`: an agent-session trace against the live service
(issue 30), the same trace `tidegate sim agent --agent-trace FILE` runs in the simulator.

Each request is sent at its trace time (open loop, as the simulator does) to /v1/completions,
streaming, with its prompt as token ids (`sims.agent_trace.StreamTokens`: seeded ids of the
model's vocabulary, the same prefix structure the simulator's ids have), ``max_tokens`` its
output length and ``ignore_eos``; with ``--session-keys`` its session name as the Claude Code
session header (``x-claude-code-session-id``), and a pinned request with tidegate's
``cache_control`` (its ``pin_ttl_s``). Figures:

- reuse captured: prompt tokens the backends found cached over the run (the gateway's
  ``vllm:prefix_cache_hits_total`` difference) over the trace's available reuse
  (`agent_trace.available_reuse`), as the simulator reports it;
- TTFT p50 of follow-up turns and of all requests;
- busiest/idlest mean in-flight tokens (``tidegate_backend_outstanding_tokens`` sampled every
  0.5 s while requests run);
- session stays/moves (``tidegate_session_requests``);
- pins: a follow-up sent after its *pinned* predecessor ended and within the pin's TTL that
  found fewer cached tokens than the predecessor's full blocks is an eviction of a pinned prefix
  (or a move of the session: `session_moves`); the same count for unpinned predecessors shows
  the pressure (their prefixes evicted).
"""
from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import numpy as np

from sims import agent_trace as at

SESSION_HEADER = "x-claude-code-session-id"
_SERIES = re.compile(r'^([a-z_:]+)\{([^}]*)\}\s+([-+0-9.eE]+)$')


def _metrics(text: str) -> dict[str, dict[str, float]]:
    """{series name: {labels text: value}} of a Prometheus text page."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m:
            out.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    return out


def _total(metrics: dict, name: str, skip_engine: str = "gateway") -> float:
    return sum(v for labels, v in metrics.get(name, {}).items()
               if f'engine="{skip_engine}"' not in labels)


async def _get_metrics(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/metrics") as r:
        return _metrics(await r.text())


async def _one(session, url, model, r: at.AgentRequest, ids, keys: bool, t0: float, rec: dict,
               timeout: float) -> None:
    await asyncio.sleep(max(0.0, t0 + r.t - time.monotonic()))
    body = {"model": model, "prompt": ids, "max_tokens": r.output_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    headers = {SESSION_HEADER: r.session} if keys else {}
    if r.pin_tokens and r.pin_ttl_s:
        body["cache_control"] = {"type": "ephemeral", "ttl": f"{r.pin_ttl_s:g}s"}
    rec["sent"] = time.monotonic()
    try:
        async with session.post(url + "/v1/completions", json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                rec["error"] = f"{resp.status}: {(await resp.text())[:200]}"
                return
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "first" not in rec and chunk.get("choices") and chunk["choices"][0].get("text"):
                    rec["first"] = time.monotonic()
                usage = chunk.get("usage")
                if usage:
                    rec["cached"] = usage.get("prompt_tokens_details", {}).get("cached_tokens")
                    rec["pin"] = usage.get("pin")
            rec.setdefault("first", time.monotonic())
            rec["end"] = time.monotonic()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"


async def replay(url: str, trace: at.AgentTrace, vocab: tuple[int, int], seed: int = 0,
                 session_keys: bool = True, model: str | None = None,
                 timeout: float = 600.0, block_size: int = 16) -> dict:
    toks = at.StreamTokens(vocab=vocab, seed=seed)
    prompts = [toks.prompt(r) for r in trace.requests]
    t_first = trace.requests[0].t
    reqs = [at.AgentRequest(r.t - t_first, r.session, r.parent, r.turn, r.segments,
                            r.output_tokens, r.pin_tokens, r.pin_ttl_s) for r in trace.requests]
    recs: list[dict] = [{} for _ in reqs]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        if model is None:
            async with session.get(url + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
        before = await _get_metrics(session, url)
        samples: list[dict[str, float]] = []
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                m = await _get_metrics(session, url)
                samples.append(m.get("tidegate_backend_outstanding_tokens", {}))
                try:
                    await asyncio.wait_for(done.wait(), 0.5)
                except asyncio.TimeoutError:
                    pass

        sampler = asyncio.create_task(sample())
        t0 = time.monotonic() + 0.2
        await asyncio.gather(*(_one(session, url, model, r, ids, session_keys, t0, rec, timeout)
                               for r, ids, rec in zip(reqs, prompts, recs)))
        done.set()
        await sampler
        after = await _get_metrics(session, url)
    return summarize(trace, recs, before, after, samples, t0, block_size)


def summarize(trace: at.AgentTrace, recs: list[dict], before: dict, after: dict,
              samples: list[dict], t0: float, block_size: int) -> dict:
    reqs = trace.requests
    avail = np.array(at.available_reuse(trace), dtype=np.float64)
    hits = _total(after, "vllm:prefix_cache_hits_total") - _total(before, "vllm:prefix_cache_hits_total")
    ok = [i for i, r in enumerate(recs) if "end" in r]
    ttft = np.array([recs[i]["first"] - recs[i]["sent"] for i in ok]) * 1e3
    follow = np.array([reqs[i].turn > 0 or reqs[i].parent is not None for i in ok])
    keys = sorted({k for s in samples for k in s})
    mean_load = np.array([np.mean([s.get(k, 0.0) for s in samples]) for k in keys]) \
        if samples and keys else np.zeros(1)
    stays = after.get("tidegate_session_requests", {})
    stayed = next((v for k, v in stays.items() if "stayed" in k), 0.0)
    moved = next((v for k, v in stays.items() if "moved" in k), 0.0)
    # pins: the follow-up of a turn within that turn's pin TTL (from its end), same session
    last: dict[str, int] = {}
    pinned_miss = pinned_checked = unpinned_miss = unpinned_checked = 0
    for i, r in enumerate(reqs):
        j = last.get(r.session)
        last[r.session] = i
        if j is None or "end" not in recs[j] or "end" not in recs[i] or recs[i].get("cached") is None:
            continue
        if recs[i]["sent"] < recs[j]["end"]:
            continue  # sent while its predecessor ran: its blocks were not all cached yet
        want = ((reqs[j].prompt_len - 1) // block_size) * block_size
        missed = recs[i]["cached"] < want
        if reqs[j].pin_tokens and recs[j].get("pin") == "pinned":
            if recs[i]["sent"] - recs[j]["end"] < reqs[j].pin_ttl_s:
                pinned_checked += 1
                pinned_miss += missed
        else:
            unpinned_checked += 1
            unpinned_miss += missed
    pins = [r.get("pin") for r in recs if r.get("pin")]
    per_request = (sum(r["cached"] for r in recs if r.get("cached") is not None)
                   if all(r.get("cached") is not None for r in recs if "end" in r) else None)
    return {
        "requests": len(reqs), "finished": len(ok),
        "errors": [r["error"] for r in recs if "error" in r][:5],
        "num_errors": sum(1 for r in recs if "error" in r),
        # per request (the first admission's hit, as the simulator counts) when the answers
        # carry it (a session key or a pin asked); else the backends' counter (recomputes of
        # preempted sequences count there again)
        "reuse_captured": (float(per_request / avail.sum()) if per_request is not None
                           else float(hits / avail.sum())) if avail.sum() else 0.0,
        "reuse_captured_counter": float(hits / avail.sum()) if avail.sum() else 0.0,
        "cached_tokens": int(per_request if per_request is not None else hits),
        "available_reuse_tokens": int(avail.sum()),
        "ttft_p50_ms_followup": float(np.median(ttft[follow])) if follow.any() else None,
        "ttft_p50_ms_first": float(np.median(ttft[~follow])) if (~follow).any() else None,
        "ttft_p50_ms": float(np.median(ttft)) if len(ttft) else None,
        "ttft_p99_ms": float(np.percentile(ttft, 99)) if len(ttft) else None,
        "busiest_idlest_inflight": (float(mean_load.max() / mean_load.min())
                                    if mean_load.min() > 0 else float("inf")),
        "mean_inflight_tokens": {k: round(float(v)) for k, v in zip(keys, mean_load)},
        "session_stays": stayed, "session_moves": moved,
        "pins": {"pinned": pins.count("pinned"), "over_budget": pins.count("over_budget"),
                 "followups_of_pinned_within_ttl": pinned_checked,
                 "pinned_prefix_evicted": pinned_miss,
                 "followups_of_unpinned": unpinned_checked,
                 "unpinned_prefix_missed": unpinned_miss,
                 "backend_pins_expired": _total(after, "tidegate_backend_pin_events")},
        "wall_s": float(max((r["end"] for r in recs if "end" in r), default=t0) - t0),
    }


def main(args) -> int:
    """`tidegate bench serve --agent-trace FILE` (called by bench.cli)."""
    trace = at.load(args.agent_trace)
    if args.agent_rate_factor != 1.0:
        trace = at.rescale(trace, args.agent_rate_factor)
    out = asyncio.run(replay(args.url, trace, args.token_id_range, args.seed,
                             not args.no_session_keys, args.model, args.timeout))
    out["trace"] = at.trace_figures(trace)
    out["trace_file"] = args.agent_trace
    out["session_keys"] = not args.no_session_keys
    print(json.dumps({k: v for k, v in out.items() if k != "trace"}, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0 if out["finished"] == out["requests"] else 1
