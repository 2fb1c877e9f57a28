"""The capacity of one backend's continuous batching, with its defaults written once.

The backend (`backend.build.BackendConfig`, `backend.engine.EngineConfig`, its CLI), the
step scheduler (`SchedulerConfig`) and the simulator (`sims.adapters.SimSchedulerConfig`,
its CLI) all take these three numbers; their defaults and their command-line flags come from
here so that a simulated deployment and a real one start from the same limits.
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
