"""Rank 0's host time to encode one step plan for the other ranks (`steps.PlanEncoder`), against
the first format (every chunk's whole block table every step), paired in one process.

    python -m bench.engine.tp_plan --batches 1,32,256 --context 512

Steady-state decode steps (each request keeps its table); what is timed is the encoding and
the int64 tensor the broadcast sends, not the broadcast itself (a network figure).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from backend.server.rank_steps import FollowedChunk, PlanEncoder
from engine_flags import int_list


def full_tables(chunks, serials: dict[str, int], block_size: int) -> torch.Tensor:
    """The first format: [n, start, serial, flags, n_blocks, tokens, all blocks] per chunk."""
    out: list[int] = []
    for c in chunks:
        n = len(c.token_ids)
        nb = -(-(c.start_pos + n) // block_size)
        out += (n, c.start_pos, serials[c.request_id], 2 if c.sample else 0, nb)
        out += c.token_ids
        out += c.block_table[:nb]
    return torch.tensor(out, dtype=torch.int64)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.tp_plan")
    p.add_argument("--batches", type=int_list, default=[1, 32, 256])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=200)
    a = p.parse_args(argv)
    nb = -(-(a.context + 1) // a.block_size)
    for batch in a.batches:
        chunks = [FollowedChunk(f"r{i}", [5], a.context, list(range(i * nb, (i + 1) * nb)), False,
                                True) for i in range(batch)]
        serials = {c.request_id: i for i, c in enumerate(chunks)}
        enc = PlanEncoder(a.block_size)
        enc.encode(chunks)  # the requests' first step: whole tables
        old, new = [], []
        for _ in range(a.repeats):  # alternating, so both see the same machine
            t0 = time.perf_counter()
            full_tables(chunks, serials, a.block_size)
            old.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            payload = torch.frombuffer(enc.encode(chunks), dtype=torch.int64)
            new.append(time.perf_counter() - t0)
        o, n = statistics.median(old), statistics.median(new)
        print(f"batch {batch:4d}: whole tables {o * 1e6:8.1f} us ({len(full_tables(chunks, serials, a.block_size))} ints)"
              f"  deltas {n * 1e6:8.1f} us ({payload.numel()} ints)  {o / n:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
