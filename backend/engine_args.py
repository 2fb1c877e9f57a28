"""The engine's command-line flags and the `BackendConfig` built from them, shared by
`tidegate backend`, `tidegate backend profile`, the engine benchmark and eval (each has its own
entry module; none imports another's)."""
from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.capacity import add_capacity_arguments

REPO_ROOT = Path(__file__).resolve().parents[1]


def default_model() -> str:
    """The repo's trained tiny coder when it is there, else the `tiny` preset (what
    `tidegate serve` and `tidegate eval speed` run when no --model is given; the gateway
    keeps the same rule in `gateway.serve.default_model`, since it may not import backend/)."""
    tiny_coder = REPO_ROOT / "models" / "tiny-coder"
    return str(tiny_coder) if (tiny_coder / "config.json").is_file() else "tiny"


def int_list(text: str) -> list[int]:
    """A comma-separated list of ints from a flag ("1,8,32"); empty items are skipped."""
    return [int(x) for x in text.split(",") if x.strip()]


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="HF model directory or preset name (default: tiny)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy", "safetensors"],
                   help="auto: safetensors for a directory, random weights for a preset")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: float32 on the CPU, the checkpoint's dtype on CUDA")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="max prompt + completion tokens (default: the model's max positions)")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--num-blocks", type=int, default=None, help="KV blocks in the pool")
    kv.add_argument("--kv-memory-fraction", type=float, default=None,
                    help="share of free memory after the weights for the KV pool "
                         "(default 0.1 on the CPU, 0.85 on CUDA)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "int4-fp8"],
                   help="KV pool format: auto (the model dtype), fp8 (E4M3 K and V + scales), "
                        "int4-fp8 (INT4 keys with per-group scales, E4M3 values); quantized "
                        "formats use the torch reference attention (also on CUDA)")
    add_capacity_arguments(p)
    p.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    p.add_argument("--seed", type=int, default=0, help="seed of random (dummy) weights")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads on the CPU (default: half the cores, at most 8)")
    p.add_argument("--echo-step-ms", type=float, default=0.0,
                   help="--model echo only: sleep this long per step (a backend that is slow "
                   "without burning a core: chaos and soak tests)")


def backend_config(args: argparse.Namespace):
    from backend.build import BackendConfig

    return BackendConfig(
        model=args.model, load_format=args.load_format, device=args.device, dtype=args.dtype,
        max_model_len=args.max_model_len, block_size=args.block_size, num_blocks=args.num_blocks,
        kv_memory_fraction=args.kv_memory_fraction, kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, seed=args.seed,
        cpu_threads=args.cpu_threads, echo_step_ms=args.echo_step_ms)
