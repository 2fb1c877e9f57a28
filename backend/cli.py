"""`tidegate backend ...`: serve a model over ZeroMQ, or `tidegate backend profile` it.

    tidegate backend --listen tcp://127.0.0.1:5555 --model tiny
    tidegate backend profile --model deepseek-coder-33b --device cuda --out profile.json

Errors a user can cause (bad model, no memory, socket in use) print one line and exit 1.
"""
from __future__ import annotations

import argparse
import sys

from backend.errors import ModelLoadError
from scheduler.capacity import add_capacity_arguments

DEFAULT_LISTEN = "tcp://127.0.0.1:5555"


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


def backend_config(args: argparse.Namespace):
    from backend.build import BackendConfig

    return BackendConfig(
        model=args.model, load_format=args.load_format, device=args.device, dtype=args.dtype,
        max_model_len=args.max_model_len, block_size=args.block_size, num_blocks=args.num_blocks,
        kv_memory_fraction=args.kv_memory_fraction, kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, seed=args.seed,
        cpu_threads=args.cpu_threads)


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate backend",
                                description="Serve one model over ZeroMQ (subcommand: profile).")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help=f"ZMQ endpoint to bind (default {DEFAULT_LISTEN})")
    p.add_argument("--backend-id", default=None, help="stable id for logs and LoadReports")
    p.add_argument("--served-model-name", default=None, help="model name in BackendInfo")
    add_engine_args(p)
    g = p.add_argument_group("GPU (backend.serving_setup, backend.cuda_graphs, backend.quantization)")
    g.add_argument("--quantization", default="none", choices=["none", "fp8"],
                   help="fp8: E4M3 weights, per-output-channel scales (CUDA, capability >= 8.9)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs: decode steps run eagerly")
    g.add_argument("--cuda-graph-buckets", default=None,
                   help="decode batch sizes to capture (default 1,2,4,8,16,24,32,48,64,96,128)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "profile":
        from backend.profile import main as profile_main

        return profile_main(argv[1:])
    args = serve_parser().parse_args(argv)
    try:
        import zmq

        from backend.build import create_engine
        from backend.worker import Worker

        engine, loaded = create_engine(backend_config(args))
        serving = _configure_serving(engine, args)
        try:
            worker = Worker(engine, loaded, args.listen, args.backend_id, args.served_model_name)
        except zmq.ZMQError as exc:
            raise ModelLoadError(f"cannot listen on {args.listen}: {exc}") from None
    except ModelLoadError as exc:
        print(f"tidegate backend: error: {exc}", file=sys.stderr)
        return 1
    worker.install_signal_handlers()
    cfg = engine.config
    print(f"tidegate backend ready on {worker.endpoint} (model {worker.model_name}, "
          f"{loaded.device}, {str(loaded.dtype).removeprefix('torch.')}, {cfg.num_blocks} KV blocks "
          f"of {cfg.block_size}, max_model_len {cfg.max_model_len}{serving})", flush=True)
    return worker.serve_forever()


def _configure_serving(engine, args: argparse.Namespace) -> str:
    """--quantization, then CUDA graphs (captured now, at start-up); a note for the ready line."""
    from backend.cuda_graphs import parse_buckets
    from backend.serving_setup import configure_serving

    try:
        buckets = parse_buckets(args.cuda_graph_buckets) if args.cuda_graph_buckets else None
        info = configure_serving(engine.runner, args.quantization, args.enforce_eager, buckets)
    except ValueError as exc:  # QuantizationError included
        raise ModelLoadError(str(exc)) from None
    note = f", {info['quantization']} weights" if info["quantization"] != "none" else ""
    if info["cuda_graphs"]:
        note += f", {len(info['buckets'])} CUDA graphs captured in {info['capture_s']:.1f} s"
    return note


if __name__ == "__main__":
    sys.exit(main())
