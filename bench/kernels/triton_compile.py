"""Compile the attention and rotary/KV-write kernels for sm_90 (H100/H200) on a machine with no
GPU: catches compile errors and shows registers / local-memory stack (spills) per variant,
so device time is not spent finding them. Needs `pip install triton` (it bundles ptxas).

    TRITON_DEFAULT_FP_FUSION=1 python -m bench.kernels.triton_compile [--warps 4,8]

Shapes are the 33B preset's (56 q / 8 kv heads, head_dim 128, block 16).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from backend.kernels import fp8_gemv as fg
from backend.kernels import paged_attention as pa
from backend.kernels import rmsnorm as rn
from backend.kernels import rotary_kv as rk
from backend.kernels import silu_mul as sm

TARGET = GPUTarget("cuda", 90, 32)
_KV_DTYPE = {0: "bf16", 1: "fp8e4nv", 2: "u8"}


def _compile(fn, types: dict[str, str], const: dict, num_warps: int, num_stages: int = 2):
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
    src = ASTSource(fn=fn, signature=sig,
                    constexprs={(names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=TARGET,
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _usage(kernel) -> str:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=False).stdout
    line = next(x for x in out.splitlines() if "REG:" in x)
    regs = line.split("REG:")[1].split()[0]
    stack = line.split("STACK:")[1].split()[0]
    return f"regs {regs:>3}  stack {stack:>4} B  smem {kernel.metadata.shared} B"


def attention(k_codec: int, v_codec: int, block_q: int, single: bool, warps: int,
              quant_f16: bool = True, pdl: bool = True) -> str:
    group_p2 = 16 if block_q == 1 else 8
    types = {"q_ptr": "*bf16", "out_ptr": "*bf16", "part_o_ptr": "*fp32",
             "part_lse_ptr": "*fp32", "k_ptr": "*" + _KV_DTYPE[k_codec],
             "ks_ptr": "*fp32", "v_ptr": "*" + _KV_DTYPE[v_codec], "vs_ptr": "*fp32",
             "block_tables_ptr": "*i32", "qsl_ptr": "*i32", "context_lens_ptr": "*i32",
             "qk_scale": "fp32"}
    const = {"NUM_HEADS": 56, "GROUP": 7, "GROUP_P2": group_p2, "HEAD_DIM": 128, "D_P2": 128, "DH_P2": 64,
                 "K_CODEC": k_codec, "V_CODEC": v_codec, "NUM_GROUPS": 4, "BLOCK_SIZE": 16,
                 "BLOCK_N": pa.BLOCK_N, "BLOCK_Q": block_q, "SINGLE_SPLIT": single, "FP32_DOT": False,
             "QUANT_F16": quant_f16, "USE_PDL": pdl}
    return _usage(_compile(pa._paged_attention_kernel, types, const, warps, pa.NUM_STAGES))


def small_kernels(pdl: bool) -> list[str]:
    """The norm, silu*mul, merge and fp8 GEMV (FMA at M = 1, dot, split-K reduce) kernels."""
    out = []
    k = _compile(rn._rms_norm_kernel, {"x_ptr": "*bf16", "residual_ptr": "*bf16",
                                       "weight_ptr": "*bf16", "out_ptr": "*bf16",
                                       "new_residual_ptr": "*bf16", "eps": "fp32"},
                 {"HAS_RESIDUAL": True, "BLOCK": 8192, "USE_PDL": pdl}, 8)
    out.append(f"rms_norm (add)         {_usage(k)}")
    k = _compile(sm._silu_and_mul_kernel, {"in_ptr": "*bf16", "out_ptr": "*bf16"},
                 {"BLOCK": 1024, "USE_PDL": pdl}, 4)
    out.append(f"silu_and_mul           {_usage(k)}")
    k = _compile(pa._merge_splits_kernel, {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
                                           "out_ptr": "*bf16"},
                 {"NUM_HEADS": 56, "HEAD_DIM": 128, "D_P2": 128, "SPLITS_P2": 8,
                  "HEADS_PER_PROGRAM": 8, "USE_PDL": pdl}, 4)
    out.append(f"merge_splits           {_usage(k)}")
    gemv_types = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "scale_ptr": "*fp32",
                  "out_ptr": "*bf16"}
    for cfg in fg.GEMV_M1_SHAPE_CONFIGS.values():
        k = _compile(fg._fp8_gemv_fma_kernel, gemv_types,
                     {"BLOCK_M": 1, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                      "PARTIALS": False, "PREFETCH": False, "USE_PDL": pdl},
                     cfg.num_warps, cfg.num_stages)
        out.append(f"fp8 gemv fma {cfg.block_n}x{cfg.block_k} w{cfg.num_warps} {_usage(k)}")
    k = _compile(fg._fp8_gemv_kernel, gemv_types,
                 {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "EVEN_K": True,
                  "PARTIALS": True, "USE_PDL": pdl}, 8, 3)
    out.append(f"fp8 gemv dot 128x128    {_usage(k)}")
    k = _compile(fg._splitk_reduce_kernel, {"part_ptr": "*fp32", "out_ptr": "*bf16"},
                 {"BLOCK": 1024, "USE_PDL": pdl}, 4)
    out.append(f"split-k reduce         {_usage(k)}")
    return out


def rotary(k_codec: int, v_codec: int) -> str:
    types = {"positions_ptr": "*i64", "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16",
             "cos_ptr": "*fp32", "sin_ptr": "*fp32", "slot_ptr": "*i64",
             "kc_ptr": "*" + _KV_DTYPE[k_codec], "ks_ptr": "*fp32",
             "vc_ptr": "*" + _KV_DTYPE[v_codec], "vs_ptr": "*fp32"}
    const = {"NUM_HEADS": 56, "NUM_KV_HEADS": 8, "HEADS_P2": 64, "KV_HEADS_P2": 8, "HALF": 64, "HALF_P2": 64,
                 "BLOCK_SIZE": 16, "K_CODEC": k_codec, "V_CODEC": v_codec, "INT4_SUB": 32,
                 "INT4_WHOLE_HEAD": False, "USE_PDL": True}
    return _usage(_compile(rk._rotary_kv_kernel, types, const, 4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", default="4,8")
    args = ap.parse_args()
    formats = {"bf16": (0, 0), "fp8": (1, 1), "int4-fp8": (2, 1)}
    for pdl in (True, False):
        for line in small_kernels(pdl):
            print(f"{line}  pdl {pdl}", flush=True)
    for name, (kc, vc) in formats.items():
        if kc:
            for f16 in (True, False):
                print(f"paged_attention {name:9s} decode quant_f16 {f16!s:5}  "
                      f"{attention(kc, vc, 1, False, 4, f16)}", flush=True)
    for name, (kc, vc) in formats.items():
        print(f"rotary_kv_write {name:9s} {rotary(kc, vc)}", flush=True)
    for warps in (int(w) for w in args.warps.split(",")):
        for name, (kc, vc) in formats.items():
            for block_q, single in ((1, True), (1, False), (pa.PREFILL_ROWS // 8, False)):
                label = f"paged_attention {name:9s} block_q {block_q} splits {'1' if single else 'n'}"
                print(f"{label:48s} warps {warps}  {attention(kc, vc, block_q, single, warps)}",
                      flush=True)


if __name__ == "__main__":
    main()
