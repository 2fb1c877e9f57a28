"""Issue 35, session 33: do a mixed step's decodes cost more when their contexts are unequal?

With the conditioned profile the live decode-only steps read the model within 0.5 % (H100, 6.7B FP8), but the busy
mixed steps (decodes + one 256-token chunk) still read 1.5-2.5 % over it, at the grid's own d too (d 32: raw model /
live 0.977), and the same-machine replay of the live compositions (contexts 512-640, max / mean ~1.1) read ~1 %
over the same shape with every context at 576 (mixed_pass_check.py). The model charges a mixed step's unequal
contexts by `ProfileCost.mixed_context_multiple` (kappa from the profile's one-long spread points), which gives these
compositions only 1.002-1.005 of their total context. This times, in one process over a filled pool, each with
replay_live's paused single runs (the harness the live steps agree with; median over seeds 1-5), at d 16 / 32 / 48:
  equal      every decode at the mean context
  uniform    the contexts evenly spaced over [lo, hi] (live-like: 512-640, mean 576), in ascending order
  shuffled   the same contexts in a seeded random order (the model's launch order matters)
  one_long   d - 1 at lo and one at 4 lo (the profile's spread point shape)
  edges      the contexts on whole 64-token tiles only, lo / mean / hi in turn (unequal, no partial tile)
  off_edge   every decode at the mean + 1 (equal, each with one key in its last tile)
(the last two, added before the first call, tell the decodes' spread from their partial tiles: the kernel runs a
decode beside a chunk as a 64-row program over 64-token tiles, sims.profile_cost "Whole tiles beside a chunk")
each beside one 256-token chunk at start 0 (mixed) and alone (decode-only), and prints each over `equal`.

    python bench/results/conditioned_s33/mixed_spread_check.py --model deepseek-coder-6.7b --device cuda \\
        --quantization fp8 --out mixed_spread_check.json
    python bench/results/conditioned_s33/mixed_spread_check.py --model tiny --device cpu --out /tmp/s.json \\
        --ds 2,3 --lo 16 --hi 24 --chunk 16                # dry run (wall ms: no timing events)
"""
import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch

from backend.engine.args import add_engine_args, backend_config, int_list
from backend.engine.assemble import ServingOptions, create_engine
from bench.engine.profile import fill_kv_pool
from bench.engine.replay_live import build_step, paused

KINDS = ("equal", "uniform", "shuffled", "one_long", "edges", "off_edge")
SEEDS = (1, 2, 3, 4, 5)


def contexts(kind: str, d: int, lo: int, hi: int) -> list[int]:
    """The decodes' contexts of one composition (module doc)."""
    mean = round((lo + hi) / 2)
    if kind == "equal":
        return [mean] * d
    if kind == "off_edge":
        return [mean + 1] * d
    if kind == "edges":
        return [(lo, mean, hi)[i % 3] for i in range(d)]
    ramp = [round(lo + (hi - lo) * i / max(1, d - 1)) for i in range(d)]
    if kind == "uniform":
        return ramp
    if kind == "shuffled":
        random.Random(d).shuffle(ramp)
        return ramp
    return [lo] * (d - 1) + [4 * lo]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--quantization", default="none", choices=["none", "fp8"])
    p.add_argument("--ds", default="16,32,48")
    p.add_argument("--lo", type=int, default=512)
    p.add_argument("--hi", type=int, default=640)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--pause-ms", type=float, default=30.0)
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    engine, loaded = create_engine(backend_config(a), ServingOptions(quantization=a.quantization))
    runner, cfg = engine.runner, engine.config
    vocab, bs, nb = loaded.config.vocab_size, cfg.block_size, cfg.num_blocks
    cuda = runner.device.type == "cuda"
    kv_fill = fill_kv_pool(runner, "random")
    ds = [d for d in int_list(a.ds) if d + 1 <= cfg.max_num_seqs and d + a.chunk <= cfg.max_num_batched_tokens]
    comps = {}
    for d in ds:
        for kind in KINDS:
            ctxs = contexts(kind, d, a.lo, a.hi)
            if max(ctxs) + 1 > cfg.max_model_len:
                continue
            for with_chunk in (True, False):
                chunks = [(a.chunk, 0)] if with_chunk else []
                comps[(d, kind, with_chunk)] = (ctxs, [build_step(ctxs, chunks, bs, nb, vocab, seed=k) for k in SEEDS])
    for _ctxs, steps in comps.values():  # warm-up: graphs, allocator
        for st in steps:
            runner.finish(runner.launch(st))
    out = {"device_name": torch.cuda.get_device_name(runner.device) if cuda else "cpu", "timed_on_device": cuda,
           "model": a.model, "quantization": a.quantization, "kv_fill": kv_fill, "ds": ds, "lo": a.lo, "hi": a.hi,
           "chunk": a.chunk, "pause_ms": a.pause_ms, "seeds": list(SEEDS), "rows": []}
    print(f"device {out['device_name']}  kv_fill {kv_fill}  ds {ds}  contexts {a.lo}-{a.hi}  chunk {a.chunk}",
          flush=True)
    ms = {}
    for key, (ctxs, steps) in comps.items():
        ms[key] = statistics.median(paused(runner, st, a.pause_ms / 1000, 1) for st in steps)
    for (d, kind, with_chunk), (ctxs, _steps) in comps.items():
        ref = ms.get((d, "equal", with_chunk))
        row = {"d": d, "kind": kind, "mixed": with_chunk, "contexts": ctxs, "ms": round(ms[d, kind, with_chunk], 4),
               "over_equal": round(ms[d, kind, with_chunk] / ref, 4) if ref else None}
        out["rows"].append(row)
    for with_chunk in (True, False):
        print("mixed (chunk at 0)" if with_chunk else "decode-only", flush=True)
        for d in ds:
            cells = [f"{r['kind']} {r['ms']:.3f} ({r['over_equal']:.4f})" for r in out["rows"]
                     if r["d"] == d and r["mixed"] == with_chunk]
            print(f"  d {d:3d}  " + "  ".join(cells), flush=True)
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} ({out['total_s']} s)", flush=True)
    return 0 if all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
