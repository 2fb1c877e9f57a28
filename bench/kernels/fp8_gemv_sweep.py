"""FP8 weight-only GEMV at M = 1, per 33B projection shape: which tile, warps, stages and K split
stream the weight fastest (issue 11: FP8 / bf16 >= 1.85x at batch 1).

    PYTHONUNBUFFERED=1 python3 -m bench.kernels.fp8_gemv_sweep --out $OUT --budget-s 100

For qkv, o, gate_up and down: bf16 F.linear, the code's current config, and every variant of
VARIANTS x PROGRAMS_PER_SM (the FMA kernel: BLOCK_M = 1). Each variant is checked against the
fp32 oracle on fresh random inputs (rel. error <= 1e-3) before it is timed; times are medians of
CUDA-graph replays with the L2 cleared (triton.testing.do_bench), as in gpu_kernels_check.py.
Prints, per shape, the best variant and its fraction of the copy bandwidth measured here, and a
layer total (the four shapes) for bf16 / current / best. Writes OUT/gemv_sweep_fp8.json
(`--weights bf16`: the same kernel over bf16 weights, OUT/gemv_sweep_bf16.json).

A tile is BN,BK,WARPS or BN,BK,WARPS,R: R = 1 sums each product tile over K at once
(`GemvConfig.row_sum_each`, fewer registers), R = 0 keeps the [BN, BK] accumulator; without R
both are tried; R = 2 / 3 is the tensor-core kernel (x padded to 16 rows) with fp16 dots
(`dot_f16`) / dots in x's dtype, once per --stages value. The shape `down_silu` is the down projection with silu*mul fused in
(`gemv_silu_mul_triton`, input: the [1, 2 x 19200] gate_up row), checked against the unfused
oracle; `qkv_norm` / `gate_up_norm` are those projections with the add + RMSNorm before them
folded in (`gemv_rms_norm_triton`, TIDEGATE_FUSED_NORM_GEMV=1; inputs: the [1, 7168] x and
residual rows), timed beside the unfused pair (norm kernel + the committed GEMV). `--tuned-out PATH` writes, per shape, the fastest variant where it beat the committed
config in this run (else the committed one) in the form `engine_bench --gemv-configs` reads.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backend.kernels import fp8_gemv as fp8
from backend.kernels.rmsnorm import fused_add_rms_norm
from backend.kernels.silu_mul import silu_and_mul

HIDDEN, INTER, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 7168, 19200, 56, 8, 128
SHAPES = {  # name: (N out, K in)
    "qkv": ((NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, HIDDEN),
    "o": (HIDDEN, NUM_HEADS * HEAD_DIM),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
    "down_silu": (HIDDEN, INTER),
    "qkv_norm": ((NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, HIDDEN),
    "gate_up_norm": (2 * INTER, HIDDEN),
}
NORM_EPS = 1e-5


def preset_shapes(name: str) -> dict[str, tuple[int, int]]:
    """The same projections (and the LM head) of another preset (`backend/presets/NAME.json`):
    the tables are keyed by (N, K), so a small model's shapes get configs of their own."""
    cfg = json.loads((ROOT / "backend" / "presets" / f"{name}.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim", hidden // heads)
    qkv = ((heads + 2 * kv_heads) * head_dim, hidden)
    return {"qkv": qkv, "o": (hidden, heads * head_dim), "gate_up": (2 * inter, hidden),
            "down": (hidden, inter), "down_silu": (hidden, inter), "qkv_norm": qkv,
            "gate_up_norm": (2 * inter, hidden), "lm_head": (cfg["vocab_size"], hidden)}
# (block_n, block_k, num_warps): the fp32 accumulator tile is block_n x block_k, so keep it at
# <= 64 registers a thread (block_n * block_k <= 2048 * num_warps)
TILES = [(8, 256, 2), (8, 512, 2), (16, 256, 2),
         (8, 512, 4), (8, 1024, 4), (16, 256, 4), (16, 512, 4), (32, 256, 4), (64, 128, 4),
         (16, 512, 8), (16, 1024, 8), (32, 256, 8), (32, 512, 8), (64, 256, 8)]
STAGES = [2, 3]
PROGRAMS_PER_SM = [1, 2, 3, 4, 6, 8]


def bench_us(fn) -> float:
    import triton.testing
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return 1e3 * float(triton.testing.do_bench(graph.replay, warmup=5, rep=20,
                                               return_mode="median"))


def unfused_pair(gate_up, w, scale, cfg):
    return fp8.fp8_gemv_triton(silu_and_mul(gate_up), w, scale, cfg)


def cublas_pair(gate_up, w):
    return F.linear(silu_and_mul(gate_up), w)


def unfused_norm_pair(x, residual, norm_w, w, scale, cfg):
    return fp8.fp8_gemv_triton(fused_add_rms_norm(x, residual, norm_w, NORM_EPS)[0], w, scale,
                               cfg)


def fused_norm_out(x, residual, norm_w, w, scale, cfg):
    return fp8.gemv_rms_norm_triton(x, residual, norm_w, NORM_EPS, w, scale, cfg)[0]


def cublas_norm_pair(x, residual, norm_w, w):
    return F.linear(fused_add_rms_norm(x, residual, norm_w, NORM_EPS)[0], w)


def committed_config(weights: str, name: str, n: int, k: int) -> fp8.GemvConfig:
    """The config the engine uses today for this one-row shape (a shape with none, e.g. a
    small preset's: the first config of the 33B's table of that kind, as a starting point)."""
    if name == "down_silu":
        table = fp8.SILU_DOWN_M1_CONFIGS[weights]
    elif name.endswith("_norm"):
        table = fp8.NORM_GEMV_M1_CONFIGS[weights]
    elif weights == "bf16":
        table = fp8.BF16_GEMV_M1_CONFIGS
    else:
        return fp8.gemv_config_for(1, n, k)
    return table.get((n, k)) or next(iter(table.values()))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=100.0)
    p.add_argument("--tiles", default=None, help="BN,BK,WARPS[,R];... instead of TILES")
    p.add_argument("--stages", default=None, help="comma-separated, instead of STAGES")
    p.add_argument("--programs", default=None, help="comma-separated, instead of PROGRAMS_PER_SM")
    p.add_argument("--shapes", default=",".join(SHAPES),
                   help="which of qkv,o,gate_up,down,down_silu,qkv_norm,gate_up_norm")
    p.add_argument("--shape-tiles", action="append", default=[],
                   help="NAME=BN,BK,WARPS[,R];...: tiles for one shape only (repeatable)")
    p.add_argument("--weights", default="fp8", choices=["fp8", "bf16"],
                   help="bf16: the same FMA kernel over bf16 weights (scale 1), i.e. our own "
                        "bf16 GEMV, against F.linear (cuBLAS)")
    p.add_argument("--tuned-out", default=None, help="JSON of the best config per shape")
    p.add_argument("--preset", default=None,
                   help="take the shapes from backend/presets/NAME.json instead of the 33B's "
                        "(adds lm_head: the vocabulary projection)")
    args = p.parse_args()
    shapes_of = preset_shapes(args.preset) if args.preset else SHAPES
    programs = [int(v) for v in args.programs.split(",")] if args.programs else PROGRAMS_PER_SM
    stages = [int(v) for v in args.stages.split(",")] if args.stages else STAGES

    def parse_tiles(text: str) -> list[tuple[int, int, int, int]]:
        tiles = []
        for t in text.split(";"):
            v = [int(x) for x in t.split(",")]
            tiles += [(v[0], v[1], v[2], r) for r in ((v[3],) if len(v) > 3 else (0, 1))]
        return tiles

    def configs_of(tile: tuple[int, int, int, int]) -> list[fp8.GemvConfig]:
        """R: 0 / 1 the row kernel (row_sum_each off / on; the loop is not pipelined, so one
        stage count); 2 / 3 the tensor-core kernel with fp16 / x-dtype dots, per stage count."""
        bn, bk, w, r = tile
        if r < 2:
            return [fp8.GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=2,
                                   programs_per_sm=pps, use_dot=False, row_sum_each=bool(r))
                    for pps in programs]
        return [fp8.GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=st,
                               programs_per_sm=pps, use_dot=True, dot_f16=r == 2)
                for st in stages for pps in programs]

    default_tiles = parse_tiles(args.tiles) if args.tiles else \
        [(bn, bk, w, r) for bn, bk, w in TILES for r in (0, 1)]
    shape_tiles = dict(kv.split("=", 1) for kv in args.shape_tiles)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    import triton.testing
    n_copy = 1 << 30
    src = torch.empty(n_copy // 2, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    copy_ms = float(triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=200,
                                            return_mode="median"))
    copy_tb_s = 2 * n_copy / copy_ms / 1e9
    src = dst = None  # free before the sweep
    print(f"copy {copy_tb_s:.3f} TB/s", flush=True)
    sms = fp8.num_sms(dev)
    results = {"copy_tb_s": copy_tb_s, "sms": sms, "weights": args.weights, "shapes": {}}
    tuned: dict[str, dict] = {}
    wbytes = 1 if args.weights == "fp8" else 2
    for name in args.shapes.split(","):
        n, k = shapes_of[name]
        gated = name == "down_silu"
        normed = name.endswith("_norm")
        tiles = parse_tiles(shape_tiles[name]) if name in shape_tiles else default_tiles
        variants = [cfg for tile in tiles for cfg in configs_of(tile)
                    if not ((gated or normed) and cfg.use_dot)]
        w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        if args.weights == "fp8":
            w_fp8, scale = fp8.quantize_fp8_per_channel(w)
        else:  # the kernel is dtype-generic: bf16 rows, no scale
            w_fp8, scale = w, None
        if gated:
            x = (2 * torch.randn(1, 2 * k, device=dev)).to(torch.bfloat16)
            ref = fp8.gemv_silu_mul_reference(x, w_fp8, scale).float()
            run = partial(fp8.gemv_silu_mul_triton, x, w_fp8, scale)
            unfused = partial(unfused_pair, x, w_fp8, scale)
            baseline = partial(cublas_pair, x, w)
        elif normed:
            x = torch.randn(1, k, device=dev).to(torch.bfloat16)
            residual = (3 * torch.randn(1, k, device=dev)).to(torch.bfloat16)
            norm_w = (1 + 0.2 * torch.randn(k, device=dev)).to(torch.bfloat16)
            ref = fp8.gemv_rms_norm_reference(x, residual, norm_w, NORM_EPS, w_fp8,
                                              scale)[0].float()
            run = partial(fused_norm_out, x, residual, norm_w, w_fp8, scale)
            unfused = partial(unfused_norm_pair, x, residual, norm_w, w_fp8, scale)
            baseline = partial(cublas_norm_pair, x, residual, norm_w, w)
        else:
            x = torch.randn(1, k, device=dev).to(torch.bfloat16)
            ones = torch.ones(n, device=dev, dtype=torch.float32)
            ref = fp8.fp8_gemv_reference(x.double(), w_fp8, ones if scale is None else scale)
            ref = ref.float()
            run = partial(fp8.fp8_gemv_triton, x, w_fp8, scale)
            baseline = partial(F.linear, x, w)
        current = committed_config(args.weights, name, n, k)
        row = {"n": n, "k": k, "bf16_us": bench_us(baseline),
               "current_config": dataclasses.asdict(current),
               "current_us": bench_us(partial(run, current)), "variants": []}
        if gated:  # the committed path today: silu_and_mul, then the down GEMV (two launches)
            row["unfused_current_us"] = bench_us(partial(unfused, committed_config(
                args.weights, "down", n, k)))
        if normed:  # the default path: the add + norm kernel, then the plain GEMV
            row["unfused_current_us"] = bench_us(partial(unfused, committed_config(
                args.weights, name[:-len("_norm")], n, k)))
        if args.weights == "fp8":
            del w
        seen_split = set()
        for cfg in variants:
            if time.monotonic() - t_start > args.budget_s:
                row["cut_by_budget"] = True
                break
            split = fp8.split_k_for(n, k, cfg, sms)
            key = (cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.row_sum_each,
                   cfg.use_dot, cfg.dot_f16, split)
            if key in seen_split:
                continue  # another programs_per_sm gave the same split
            seen_split.add(key)
            y = run(cfg)
            err = ((y.float() - ref).norm() / ref.norm()).item()
            entry = {"config": dataclasses.asdict(cfg), "split_k": split[0], "rel_err": err}
            if err <= 1e-2:
                entry["us"] = bench_us(partial(run, cfg))
            row["variants"].append(entry)
        timed = [v for v in row["variants"] if "us" in v]
        if timed:
            best = min(timed, key=lambda v: v["us"])
            row["best"] = best
            tb = wbytes * n * k / best["us"] / 1e6
            extra = (f"  unfused pair {row['unfused_current_us']:6.1f} us"
                     if gated or normed else "")
            print(f"{name:9s} bf16 {row['bf16_us']:6.1f} us  current {row['current_us']:6.1f} us"
                  f"{extra}  best {best['us']:6.1f} us ({tb:.2f} TB/s, {tb / copy_tb_s:.0%} of "
                  f"copy) {best['config']} split {best['split_k']}", flush=True)
            win = best["config"] if best["us"] < row["current_us"] else row["current_config"]
            table = (f"silu_down_{args.weights}" if gated else
                     f"norm_{args.weights}" if normed else args.weights)
            tuned.setdefault(table, {})[f"{n}x{k}"] = win
        results["shapes"][name] = row
        (out / f"gemv_sweep_{args.weights}.json").write_text(json.dumps(results, indent=1) + "\n")
        if args.tuned_out:
            Path(args.tuned_out).write_text(json.dumps(tuned, indent=1) + "\n")
    shapes = [results["shapes"][s] for s in ("qkv", "o", "gate_up", "down")
              if s in results["shapes"]]
    if len(shapes) == 4 and all("best" in r for r in shapes):
        bf16 = sum(r["bf16_us"] for r in shapes)
        cur = sum(r["current_us"] for r in shapes)
        best = sum(r["best"]["us"] for r in shapes)
        results["layer_us"] = {"bf16": bf16, "current": cur, "best": best}
        print(f"layer (qkv+o+gate_up+down): bf16 {bf16:.1f} us, {args.weights} current "
              f"{cur:.1f} us ({bf16 / cur:.2f}x), best {best:.1f} us ({bf16 / best:.2f}x)",
              flush=True)
    (out / f"gemv_sweep_{args.weights}.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"sweep took {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
