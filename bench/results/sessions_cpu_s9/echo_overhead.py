"""TTFT through gateway + echo backend (no model) by prompt length: the serving path's own cost."""
import asyncio
import random
import statistics
import sys

import aiohttp

from bench.serving.session_ttft import _ttft

URL = sys.argv[1]
async def main():
    rng = random.Random(0)
    out = {}
    async with aiohttp.ClientSession() as s:
        await _ttft(s, URL, "echo", [65]*8, 2, {}, {})
        for n in (64, 2048, 8192, 16368):
            for hdr in ({}, {"x-claude-code-session-id": "s1"}):
                xs = []
                base = [rng.randrange(3, 256) for _ in range(n)]
                for i in range(7):
                    ids = base if hdr else [rng.randrange(3, 256) for _ in range(n)]
                    t, _ = await _ttft(s, URL, "echo", ids, 16, hdr, {})
                    xs.append(t)
                key = f"{n} {'session' if hdr else 'fresh'}"
                out[key] = statistics.median(xs)
                print(key, f"TTFT p50 {statistics.median(xs):.2f} ms (min {min(xs):.2f})", flush=True)
asyncio.run(main())
