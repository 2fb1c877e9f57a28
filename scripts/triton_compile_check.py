"""Compile the attention and rotary/KV-write kernels for sm_90 (H100/H200) on a machine with no
GPU: catches compile errors and shows registers / local-memory stack (spills) per variant,
so device time is not spent finding them. Needs `pip install triton` (it bundles ptxas).

    TRITON_DEFAULT_FP_FUSION=1 python scripts/triton_compile_check.py [--warps 4,8]

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

from backend.kernels import paged_attention as pa
from backend.kernels import rotary_kv as rk

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


def attention(k_codec: int, v_codec: int, block_q: int, single: bool, warps: int) -> str:
    group_p2 = 16 if block_q == 1 else 8
    types = {"q_ptr": "*bf16", "out_ptr": "*bf16", "part_o_ptr": "*fp32",
             "part_lse_ptr": "*fp32", "k_ptr": "*" + _KV_DTYPE[k_codec],
             "ks_ptr": "*fp32", "v_ptr": "*" + _KV_DTYPE[v_codec], "vs_ptr": "*fp32",
             "block_tables_ptr": "*i32", "qsl_ptr": "*i32", "context_lens_ptr": "*i32",
             "qk_scale": "fp32"}
    const = {"NUM_HEADS": 56, "GROUP": 7, "GROUP_P2": group_p2, "HEAD_DIM": 128, "D_P2": 128, "DH_P2": 64,
                 "K_CODEC": k_codec, "V_CODEC": v_codec, "NUM_GROUPS": 4, "BLOCK_SIZE": 16,
                 "BLOCK_N": pa.BLOCK_N, "BLOCK_Q": block_q, "SINGLE_SPLIT": single, "FP32_DOT": False}
    return _usage(_compile(pa._paged_attention_kernel, types, const, warps, pa.NUM_STAGES))


def rotary(k_codec: int, v_codec: int) -> str:
    types = {"positions_ptr": "*i64", "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16",
             "cos_ptr": "*fp32", "sin_ptr": "*fp32", "slot_ptr": "*i64",
             "kc_ptr": "*" + _KV_DTYPE[k_codec], "ks_ptr": "*fp32",
             "vc_ptr": "*" + _KV_DTYPE[v_codec], "vs_ptr": "*fp32"}
    const = {"NUM_HEADS": 56, "NUM_KV_HEADS": 8, "HEADS_P2": 64, "KV_HEADS_P2": 8, "HALF": 64, "HALF_P2": 64,
                 "BLOCK_SIZE": 16, "K_CODEC": k_codec, "V_CODEC": v_codec, "INT4_SUB": 32,
                 "INT4_WHOLE_HEAD": False}
    return _usage(_compile(rk._rotary_kv_kernel, types, const, 4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", default="4,8")
    args = ap.parse_args()
    formats = {"bf16": (0, 0), "fp8": (1, 1), "int4-fp8": (2, 1)}
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
