"""The capacity of one backend's continuous batching, with its defaults written once.

The backend (`backend.engine.assemble.BackendConfig`, `backend.engine.continuous.EngineConfig`, its CLI), the
step scheduler (`SchedulerConfig`) and the simulator (`sims.adapters.SimSchedulerConfig`,
its CLI) all take these three numbers; their defaults and their command-line flags come from
here so that a simulated deployment and a real one start from the same limits. The same holds
for the per-step prefill cap while sequences decode (`PrefillCap`, its flags below).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class CapacityConfig:
    max_num_seqs: int = 256  # running sequences (decoding or mid-prefill) at most
    max_num_batched_tokens: int = 2048  # tokens fed per step (decodes count 1 each)
    block_size: int = 16  # tokens per KV block


DEFAULT_CAPACITY = CapacityConfig()


def add_capacity_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                           defaults: CapacityConfig = DEFAULT_CAPACITY) -> None:
    """--max-num-seqs, --max-num-batched-tokens, --block-size with the defaults above."""
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs,
                        help=f"running sequences per step at most (default {defaults.max_num_seqs})")
    parser.add_argument("--max-num-batched-tokens", type=int,
                        default=defaults.max_num_batched_tokens,
                        help=f"tokens per step at most (default {defaults.max_num_batched_tokens})")
    parser.add_argument("--block-size", type=int, default=defaults.block_size,
                        help=f"tokens per KV block (default {defaults.block_size})")


@dataclass(frozen=True)
class PrefillCap:
    """Prefill budget by backlog (`StepScheduler.schedule`, its module doc). While sequences
    decode and the prefill backlog is small — at most `backlog_tokens` prompt tokens not yet
    computed (None: one full max_num_batched_tokens) in at most `backlog_seqs` requests, waiting
    or mid-prefill — a step carries at most `max_tokens` prefill tokens, so that an arrival
    stalls the running streams for a few short steps instead of one long one (ITL). A deeper
    backlog (a burst) gets the whole budget: every step re-reads the weights whatever its size,
    so short steps would cost its throughput. `max_tokens` 0: off.

    Why a request count too: the 16/32 x256 burst's tail is 128 short prompts, 2,048 tokens —
    "one budget" by tokens, yet capping it adds six steps that every one of the 128 running
    streams waits through (simulated on the H200's serving steps: TPOT p50 34.6 -> 39.3 ms, goal
    <= 35);
    at 512/128 8 req/s the backlog is one to four prompts (BENCHMARKS, issue 11, fourth session)."""

    max_tokens: int = 0
    backlog_tokens: int | None = None
    backlog_seqs: int = 4

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"the prefill cap while decoding must be >= 0 (0: off), got {self.max_tokens}")
        if self.backlog_tokens is not None and self.backlog_tokens < 0:
            raise ValueError(f"prefill backlog tokens must be >= 0, got {self.backlog_tokens}")
        if self.backlog_seqs < 0:
            raise ValueError(f"prefill backlog requests must be >= 0, got {self.backlog_seqs}")


# The cap a CUDA backend takes when --max-prefill-tokens-while-decoding is not given. Why 256:
# at 8 req/s of 512-token prompts ~25 streams decode, so a 256-token chunk makes a step of the
# 320-token graph bucket, ~1.9x a decode step (issue 11's ITL p99 goal is 2.5x), while 320 goes
# to bucket 384 (2.07x) and 192 prefills slower than prompts arrive (BENCHMARKS, issue 11,
# "prefill budget by backlog"). On the CPU a step's cost grows with its tokens from zero, so a
# long prefill step has no fixed cost to amortize there and the cap is left off.
CUDA_PREFILL_CAP_TOKENS = 256


def add_prefill_cap_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--max-prefill-tokens-while-decoding, --prefill-backlog-tokens, --prefill-backlog-seqs."""
    defaults = PrefillCap()
    parser.add_argument("--max-prefill-tokens-while-decoding", type=int, default=None,
                        metavar="N",
                        help="while sequences decode and the prefill backlog is small (the two "
                        "flags below), a step carries at most N prefill tokens: an arrival stalls "
                        "the running streams for short steps, not one long one (ITL); a deeper "
                        "backlog gets the whole --max-num-batched-tokens. 0: off. Default: "
                        f"{CUDA_PREFILL_CAP_TOKENS} on a CUDA backend, off on the CPU and in the "
                        "simulator unless given (BENCHMARKS, issue 11)")
    parser.add_argument("--prefill-backlog-tokens", type=int, default=defaults.backlog_tokens,
                        metavar="N",
                        help="the backlog is small at <= N prompt tokens not yet computed "
                        "(default: --max-num-batched-tokens)")
    parser.add_argument("--prefill-backlog-seqs", type=int, default=defaults.backlog_seqs,
                        metavar="N",
                        help="the backlog is small only in <= N requests, waiting or "
                        f"mid-prefill (default {defaults.backlog_seqs})")


def prefill_cap_from_args(args: argparse.Namespace, device: str = "cpu") -> PrefillCap:
    """The `PrefillCap` of the flags above for a backend on `device` (an absent cap: see
    `CUDA_PREFILL_CAP_TOKENS`); ValueError on a negative value."""
    max_tokens = args.max_prefill_tokens_while_decoding
    if max_tokens is None:
        max_tokens = CUDA_PREFILL_CAP_TOKENS if device.startswith("cuda") else 0
    return PrefillCap(max_tokens, args.prefill_backlog_tokens, args.prefill_backlog_seqs)
