"""Decode-heavy streams with long Slow prompts mixed in, through the HTTP API (issue 34): the
tail inter-token latency of the streams and the long prompts' TTFT, for comparing one mixed
backend with a prefill-only + decode pair (`tidegate serve --kv-pull`, `--role prefill`).

    python -m bench.serving.kv_split --url http://127.0.0.1:8000 --rate 4 --duration 60 \\
        --slow-rate 0.5 --slow-prompt 8192 --json out/split.json

Streams: 512-token prompts, 128 tokens out, Poisson at --rate. Long: --slow-prompt tokens, 128
out (Slow class), Poisson at --slow-rate. Random token prompts (a seed each run: no prefix
cache carries over). ITL = gaps between a stream's token chunks after its first.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random

import numpy as np

from bench.serving.loadgen import HttpTarget, run_http


def schedule(rate: float, slow_rate: float, duration: float, slow_prompt: int, vocab: int,
             seed: int):
    rng = random.Random(seed)
    events = []  # (offset, prompt, max_tokens, kind)
    for r, n, kind in ((rate, 512, "stream"), (slow_rate, slow_prompt, "long")):
        t = rng.expovariate(r) if r > 0 else duration
        while t < duration:
            events.append((t, [rng.randrange(3, vocab) for _ in range(n)], 128, kind))
            t += rng.expovariate(r)
    events.sort(key=lambda e: e[0])
    return events


def pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serving.kv_split",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--slow-rate", type=float, default=0.5)
    ap.add_argument("--slow-prompt", type=int, default=8192)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    events = schedule(a.rate, a.slow_rate, a.duration, a.slow_prompt, a.vocab, a.seed)
    records, _, _ = asyncio.run(run_http(HttpTarget(url=a.url), [e[0] for e in events],
                                         [e[1] for e in events], [e[2] for e in events]))
    itl, ttft_stream, ttft_long, errors = [], [], [], 0
    for e, rec in zip(events, records):
        if not rec.ok:
            errors += 1
            continue
        ttft = rec.first_token_time - rec.send_time
        if e[3] == "long":
            ttft_long.append(ttft * 1e3)
        else:
            ttft_stream.append(ttft * 1e3)
            itl += list(np.diff(rec.chunk_times) * 1e3)
    out = {"label": a.label, "rate": a.rate, "slow_rate": a.slow_rate,
           "slow_prompt": a.slow_prompt, "duration": a.duration,
           "num_streams": len(ttft_stream), "num_long": len(ttft_long), "errors": errors,
           "itl_ms": {"p50": pct(itl, 50), "p90": pct(itl, 90), "p99": pct(itl, 99)},
           "stream_ttft_ms": {"p50": pct(ttft_stream, 50), "p99": pct(ttft_stream, 99)},
           "long_ttft_ms": {"p50": pct(ttft_long, 50), "p99": pct(ttft_long, 99)}}
    out["itl_p99_over_p50"] = out["itl_ms"]["p99"] / out["itl_ms"]["p50"]
    print(f"{a.label}: ITL p50 {out['itl_ms']['p50']:.1f} p99 {out['itl_ms']['p99']:.1f} ms "
          f"(x{out['itl_p99_over_p50']:.2f}); long prompts' TTFT p50 "
          f"{out['long_ttft_ms']['p50']:.0f} p99 {out['long_ttft_ms']['p99']:.0f} ms; "
          f"{len(ttft_stream)} streams, {len(ttft_long)} long, {errors} errors")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
