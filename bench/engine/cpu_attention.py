"""`python -m bench.engine.cpu_attention`: the CPU paged attention kernel alone on a decode step.

B sequences decoding at contexts drawn from [--ctx-lo, --ctx-hi], bf16 pages, one call per layer
for --layers layers' pools in turn (each layer its own K/V pools, as in an engine, so a step reads
cold pages when the pools outgrow the cache); the time per layer of the AMX path
(`paged_attention_amx.c`, where the CPU has it) and of the portable kernel (`cpu_amx_mode(0)`),
alternating, and the largest difference between their outputs. CPU time of this thread.

    python -m bench.engine.cpu_attention --batch 200 --heads 6 --kv-heads 2 --layers 14

Blocks are handed out in order by default (the block manager's pattern on a fresh engine);
`--shuffle` scatters them over the pool.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.cpu_attention")
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--ctx-lo", type=int, default=129)
    p.add_argument("--ctx-hi", type=int, default=160)
    p.add_argument("--layers", type=int, default=14)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args(argv)
    from backend.kernels.cpu import load_library

    torch.set_num_threads(1)
    lib = load_library()
    if lib is None:
        print("no CPU kernels (no C compiler?)", file=sys.stderr)
        return 1
    rnd = random.Random(0)
    g = torch.Generator().manual_seed(0)
    bs, hd = a.block_size, a.head_dim
    lens = [rnd.randint(a.ctx_lo, a.ctx_hi) for _ in range(a.batch)]
    num_blocks = sum(-(-c // bs) for c in lens) + 8
    order = list(range(num_blocks))
    if a.shuffle:
        rnd.shuffle(order)
    width = max(-(-c // bs) for c in lens)
    tables = torch.zeros(a.batch, width, dtype=torch.int32)
    nxt = 0
    for i, c in enumerate(lens):
        for b in range(-(-c // bs)):
            tables[i, b] = order[nxt]
            nxt += 1
    pools = [(torch.randn(num_blocks, bs, a.kv_heads, hd, generator=g).bfloat16(),
              torch.randn(num_blocks, bs, a.kv_heads, hd, generator=g).bfloat16())
             for _ in range(a.layers)]
    q = torch.randn(a.batch, a.heads, hd, generator=g).bfloat16()
    qsl = torch.arange(a.batch + 1, dtype=torch.int32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    outs = {True: torch.empty_like(q), False: torch.empty_like(q)}

    def step(amx: bool) -> float:
        lib.cpu_amx_mode(1 if amx else 0)
        out = outs[amx]
        t0 = time.thread_time()
        for kc, vc in pools:
            rc = lib.paged_attention_bf16(q.data_ptr(), a.heads * hd, kc.data_ptr(), vc.data_ptr(),
                                          tables.data_ptr(), width, qsl.data_ptr(), ctx.data_ptr(),
                                          a.batch, a.heads, a.kv_heads, hd, bs, hd ** -0.5,
                                          out.data_ptr())
            if rc != 0:
                raise RuntimeError(f"kernel refused the shapes ({rc})")
        return (time.thread_time() - t0) / a.layers * 1e3

    has_amx = bool(lib.cpu_amx_mode(1))
    kinds = [True, False] if has_amx else [False]
    times: dict[bool, list[float]] = {k: [] for k in kinds}
    for k in kinds:
        step(k)  # warm-up
    for _ in range(a.repeats):
        for k in kinds:
            times[k].append(step(k))
    lib.cpu_amx_mode(1)
    for k in kinds:
        ts = sorted(times[k])
        print(f"{'amx' if k else 'portable':8s} B={a.batch} heads {a.heads}/{a.kv_heads} "
              f"head_dim {hd} ctx {a.ctx_lo}-{a.ctx_hi} layers {a.layers}"
              f"{' shuffled' if a.shuffle else ''}: median {ts[len(ts) // 2]:.3f} ms a layer "
              f"(min {ts[0]:.3f})")
    if has_amx:
        diff = (outs[True].float() - outs[False].float()).abs().max().item()
        print(f"largest |amx - portable| {diff:.2e} (bf16 outputs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
