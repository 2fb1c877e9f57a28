"""The `BackendConfig` built from the engine's command-line flags (defined in `engine_flags`),
shared by `tidegate backend`, `tidegate backend profile`, the engine benchmark and eval (each has
its own entry module; none imports another's)."""
from __future__ import annotations

import argparse

# the flags themselves live in the torch-free leaf, so that `tidegate serve` can take them too
from engine_flags import add_engine_args, default_model, int_list
from scheduler.capacity import prefill_cap_from_args
from scheduler.speculation import speculation_config_from_args

__all__ = ["add_engine_args", "backend_config", "default_model", "int_list"]


def backend_config(args: argparse.Namespace):
    from backend.engine.assemble import BackendConfig
    from backend.errors import ModelLoadError

    try:
        prefill_cap = prefill_cap_from_args(args, args.device)
    except ValueError as exc:
        raise ModelLoadError(f"--max-prefill-tokens-while-decoding / --prefill-backlog-*: {exc}") from None

    return BackendConfig(
        model=args.model, load_format=args.load_format, device=args.device, dtype=args.dtype,
        max_model_len=args.max_model_len, block_size=args.block_size, num_blocks=args.num_blocks,
        kv_memory_fraction=args.kv_memory_fraction, kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, prefill_cap=prefill_cap,
        enable_prefix_caching=not args.no_prefix_caching, host_kv_gib=args.host_kv_gib,
        waiting_by_class=getattr(args, "waiting_by_class", False),
        deadline_order=getattr(args, "deadline_order", False),
        deadline_margin_ms=getattr(args, "deadline_margin_ms", 0.0),
        seed=args.seed,
        cpu_threads=args.cpu_threads, echo_step_ms=args.echo_step_ms,
        speculation_config=_speculation(args))


def _speculation(args: argparse.Namespace):
    """The `--speculation` flags (a serving backend's, `engine_flags.add_serving_args`); None
    (off) where a command has none of them (eval, profile)."""
    from backend.errors import ModelLoadError

    if getattr(args, "speculation", "off") != "on":
        return None
    try:
        return speculation_config_from_args(args)
    except ValueError as exc:
        raise ModelLoadError(f"--speculation*: {exc}") from None
