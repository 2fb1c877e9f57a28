"""`tidegate backend profile`: measure step times for the simulator's measured cost model.

Runs the real runner (model + sampler) on synthetic steps over a grid of
(decode batch size d, prefill tokens p, context length c) and writes the profile JSON
described in docs/contracts.md ("profile JSON"). Each point is one step holding d decodes whose
context is c tokens each, plus (if p > 0) one prefill chunk of p tokens from position 0.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from backend.errors import ModelLoadError

FORMAT = "tidegate-profile/1"


@dataclass
class _Chunk:
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    is_prefill: bool
    sample: bool = True


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    from backend.cli import add_engine_args

    p = argparse.ArgumentParser(prog="tidegate backend profile",
                                description="Measure step times over (decode batch, prefill tokens, context).")
    add_engine_args(p)
    p.add_argument("--out", required=True, help="path of the profile JSON to write")
    p.add_argument("--decode-batch-sizes", default="0,1,8,32,64", help="comma-separated d values")
    p.add_argument("--prefill-tokens", default="0,128,512,2048", help="comma-separated p values")
    p.add_argument("--context-lens", default="128,1024", help="comma-separated decode context lengths c")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per point")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions per point")
    return p


def make_step(d: int, p: int, c: int, block_size: int, num_blocks: int, vocab: int) -> list[_Chunk]:
    """d decodes of context c, then one p-token prefill; block tables wrap around the pool."""
    chunks: list[_Chunk] = []
    nb_dec = -(-c // block_size)
    next_block = 0

    def table(n: int) -> list[int]:
        nonlocal next_block
        t = [(next_block + i) % num_blocks for i in range(n)]
        next_block += n
        return t

    for i in range(d):
        chunks.append(_Chunk(f"d{i}", [(7 * i + 1) % vocab], c - 1, table(nb_dec), False))
    if p:
        ids = [(13 * j + 5) % vocab for j in range(p)]
        chunks.append(_Chunk("p", ids, 0, table(-(-p // block_size)), True))
    return chunks


def measure(runner, chunks, repeats: int, warmup: int) -> list[float]:
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + repeats):
        sync()
        t0 = time.perf_counter()
        runner.execute(chunks)
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
    return times


def run(args: argparse.Namespace) -> dict:
    from backend.build import create_engine
    from backend.cli import backend_config

    engine, loaded = create_engine(backend_config(args))
    runner, cfg = engine.runner, engine.config
    points = []
    for c in _ints(args.context_lens):
        for d in _ints(args.decode_batch_sizes):
            for p in _ints(args.prefill_tokens):
                if d + p == 0 or d > cfg.max_num_seqs - (1 if p else 0) \
                        or d + p > cfg.max_num_batched_tokens or max(c, p) > cfg.max_model_len:
                    continue
                if d == 0 and c != _ints(args.context_lens)[0]:
                    continue  # prefill-only points do not depend on c
                chunks = make_step(d, p, c, cfg.block_size, cfg.num_blocks, loaded.config.vocab_size)
                ms = measure(runner, chunks, args.repeats, args.warmup)
                points.append({
                    "num_decode_seqs": d, "num_prefill_tokens": p, "context_len": c if d else 0,
                    "num_context_tokens": d * c + p, "step_ms": statistics.fmean(ms),
                    "step_ms_min": min(ms), "step_ms_median": statistics.median(ms), "repeats": len(ms)})
                print(f"d={d:4d} p={p:6d} c={c:6d}  {statistics.fmean(ms):9.3f} ms", flush=True)
    dev = loaded.device
    return {
        "format": FORMAT, "model": loaded.config.name, "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(loaded.dtype).removeprefix("torch."), "block_size": cfg.block_size,
        "num_kv_blocks": cfg.num_blocks, "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens, "max_model_len": cfg.max_model_len,
        "torch_version": torch.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "points": points,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        doc = run(args)
    except ModelLoadError as exc:
        print(f"tidegate backend profile: error: {exc}", file=sys.stderr)
        return 1
    if len(doc["points"]) < 2:
        print("tidegate backend profile: error: fewer than two grid points fit the limits", file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {len(doc['points'])} points to {args.out}")
    return 0
