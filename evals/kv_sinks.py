"""Issue 12's attention-sinks question, measured: does keeping some keys of an int4-fp8 cache in
full precision buy back its perplexity? Teacher-forced held-out perplexity through our engine (the
torch reference attention, CPU or GPU), int4-fp8 KV cache, with the key pools wrapped so that:

- `sinks S`: the first S tokens of every sequence (offsets < S of its first block) are read at
  full precision — the "attention sink" tokens most heads attend to heavily;
- `fill`: the block being filled is read at full precision. With `--max-num-batched-tokens`
  equal to the block size (the default here) every prefill chunk is exactly one block, so the
  current chunk's own block is the last block of its context: in serving, the tokens of a
  decode's last, partly filled block would be kept in bf16 until the block is full.

Two more int4 key layouts, quantized by the torch reference only (the kernels are not changed):

- `gN`: a scale per N channels instead of 32 (more scales: the bytes change);
- `h`: the scales stored in fp16 instead of fp32 (rounded before the codes are computed), so
  `g16+h` takes exactly the bytes of today's int4 keys (64 code + 8 x 2 scale bytes per
  token-head at D = 128, as 64 + 4 x 4).

`+built` runs a variant with the engine's own fill rows (`backend.kv.fill_slots`: the block being
filled kept in the model dtype, as serving does) instead of this wrapper; every other variant
runs with them off (TIDEGATE_KV_FILL_BLOCK=0), so `int4` is the plain format. `int4+built` must
equal `int4+fill`: the test that the built format gives the quality this experiment measured.

Values stay fp8 (near lossless: +0.3% alone). This is an experiment on the read side only — the
pools keep a full-precision shadow of every slot, so it measures the quality a real format
(sink/fill keys stored in bf16 beside the int4 pages) would give, not its memory or speed.

    python -m evals.kv_sinks --model models/tiny-coder --sample-windows 32 \
        --variants auto,int4,int4+sinks4,int4+fill,int4+sinks4+fill --json out.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.kv import formats as kv_quant
from backend.kv.pools import FILL_BLOCK_ENV
from evals import cli as tg_eval
from evals import engine as eval_engine
from evals.engine import EngineSettings, EngineShape


class ShadowedKeyPages:
    """A quantized key pool whose reads put full-precision keys back where the variant says.

    Delegates everything to the wrapped `QuantizedPages` except `write` (also keeps an fp32
    shadow of each slot) and `pages` (dequantize, then overwrite the kept positions from the
    shadow). Only the prefill read path (`block_ids` 1-d: one sequence's table, first block
    first, current block last) is specialised; decode reads (2-d) stay fully quantized."""

    def __init__(self, inner, sinks: int, fill: bool) -> None:
        self.inner, self.sinks, self.keep_fill = inner, sinks, fill
        self.shadow = torch.zeros(inner.shape, dtype=torch.float32, device=inner.device)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        self.inner.write(slots, x)
        n = self.inner.shape[0] * self.inner.shape[1]
        self.shadow.view(n, *self.inner.shape[2:]).index_copy_(0, slots, x.float())

    def pages(self, block_ids: torch.Tensor) -> torch.Tensor:
        out = self.inner.pages(block_ids)
        if block_ids.dim() == 1 and block_ids.numel():
            if self.sinks:
                out[0, : self.sinks] = self.shadow[block_ids[0], : self.sinks]
            if self.keep_fill:
                out[-1] = self.shadow[block_ids[-1]]
        return out

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.inner.copy_blocks(src, dst)
        self.shadow.index_copy_(0, dst, self.shadow.index_select(0, src))


def parse_variant(name: str) -> tuple[str, int, bool, int, bool]:
    """'auto' | 'int4' [+sinksN] [+fill] [+gN] [+h] -> (kv_cache_dtype, sinks, fill, group,
    fp16 scales)."""
    parts = name.split("+")
    if parts[0] == "auto":
        if len(parts) > 1:
            raise SystemExit(f"variant {name!r}: sinks/fill/gN/h apply to int4 only")
        return "auto", 0, False, kv_quant.INT4_GROUP, False
    if parts[0] != "int4":
        raise SystemExit(f"unknown variant {name!r} (auto, int4[+sinksN][+fill][+gN][+h])")
    sinks, fill, group, half = 0, False, kv_quant.INT4_GROUP, False
    for p in parts[1:]:
        if p == "fill":
            fill = True
        elif p == "h":
            half = True
        elif m := re.fullmatch(r"sinks(\d+)", p):
            sinks = int(m.group(1))
        elif m := re.fullmatch(r"g(\d+)", p):
            group = int(m.group(1))
        else:
            raise SystemExit(f"variant {name!r}: unknown part {p!r}")
    return "int4-fp8", sinks, fill, group, half


@contextlib.contextmanager
def int4_layout(group: int, half_scales: bool):
    """int4 keys with `group` channels per scale and (optionally) fp16 scales for the duration
    of one run: `backend.kv.formats`'s layout constants, which every path reads (the reference
    codec here; the Triton write and attention take the layout from the pools' shapes)."""
    saved = kv_quant.INT4_GROUP, kv_quant.INT4_SCALE_DTYPE
    kv_quant.INT4_GROUP = group
    kv_quant.INT4_SCALE_DTYPE = torch.float16 if half_scales else torch.float32
    try:
        yield
    finally:
        kv_quant.INT4_GROUP, kv_quant.INT4_SCALE_DTYPE = saved


def run(args: argparse.Namespace, variant: str) -> dict:
    built = variant.endswith("+built")
    kv_dtype, sinks, fill, group, half = parse_variant(variant.removesuffix("+built"))
    original = eval_engine.build_engine

    def build_and_wrap(model, settings, shape):
        engine, loaded = original(model, settings, shape)
        if sinks or fill:
            kv = engine.runner.kv
            kv.k_caches = [ShadowedKeyPages(c, sinks, fill) for c in kv.k_caches]
        return engine, loaded

    tg_eval.build_engine = build_and_wrap  # the perplexity driver looks it up in its module
    saved_env = os.environ.get(FILL_BLOCK_ENV)
    os.environ[FILL_BLOCK_ENV] = "1" if built else "0"
    try:
        settings = EngineSettings(device=args.device, dtype=args.dtype, kv_cache_dtype=kv_dtype)
        shape = EngineShape(max_num_batched_tokens=args.max_num_batched_tokens)
        t0 = time.perf_counter()
        with int4_layout(group, half):
            report = tg_eval.perplexity(args.model, settings, shape, window=args.window,
                                        sample_windows=args.sample_windows, progress=False,
                                        site_root=args.site_root)
    finally:
        tg_eval.build_engine = original
        if saved_env is None:
            os.environ.pop(FILL_BLOCK_ENV)
        else:
            os.environ[FILL_BLOCK_ENV] = saved_env
    return {"variant": variant, "kv_cache_dtype": kv_dtype, "sinks": sinks, "fill": fill,
            "built_fill": built,
            "int4_group": group, "fp16_scales": half,
            "ppl": report["ppl"], "tokens": report["tokens"],
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="models/tiny-coder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--sample-windows", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=16,
                   help="chunk size; = the block size makes each chunk one block (see 'fill')")
    p.add_argument("--site-root", default=None)
    p.add_argument("--variants", default="auto,int4,int4+sinks4,int4+fill,int4+sinks4+fill")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = []
    for v in args.variants.split(","):
        row = run(args, v)
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = next((r["ppl"] for r in rows if r["variant"] == "auto"), None)
    print("\n| variant | ppl | vs auto |\n|---|---|---|")
    for r in rows:
        rel = f"{(r['ppl'] / base - 1) * 100:+.2f}%" if base else "–"
        print(f"| {r['variant']} | {r['ppl']:.4f} | {rel} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
