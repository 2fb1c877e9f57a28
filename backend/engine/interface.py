"""What the worker needs of an engine: the one declared seam between `backend.server` and the
three engines (ours in `continuous.py`, `echo.py` for tests and benchmarks, vLLM's in `vllm.py`).

The worker never reaches through an engine into its scheduler, block manager or runner: what it
reports to the gateway (`LoadReport`, `BackendInfo`) it asks for through `load()`,
`prefix_cache_probe()` and the attributes below, so an engine is free to keep its state however
it likes. `tests/test_engine_interface.py` checks that every engine implements all of it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class EngineLoad:
    """An engine's load, as the worker's LoadReport carries it (the fields keep its names)."""
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    num_outstanding_tokens: int       # max_tokens still to generate over every request held
    num_preemptions: int = 0
    num_swap_preemptions: int = 0     # preemptions that parked KV in the host tier
    num_host_blocks: int = 0          # host tier size (0: no tier)
    num_host_used_blocks: int = 0
    num_host_hit_tokens: int = 0      # prompt tokens served from the host tier
    num_prompt_tokens: int = 0        # prompt tokens looked up in the prefix cache
    num_cached_prompt_tokens: int = 0  # of which found
    num_pins: int = 0                 # prefix pins held (issue 30), and their blocks
    num_pinned_blocks: int = 0
    pin_budget_blocks: int = 0
    num_pins_refused: int = 0
    num_pins_expired: int = 0
    # speculative decoding by draft source (scheduler.speculation.SourceCounters), engines
    # that speculate; empty: not reported by source
    spec_decode: tuple = ()
    # admissions the deadline order moved before the class order's next request
    # (scheduler.deadline_order; logged by the worker at shutdown)
    num_promoted: int = 0


@runtime_checkable
class ServingEngine(Protocol):
    """The contract. `config` is a `backend.engine.continuous.EngineConfig` (block size, pool size,
    max_model_len, prefix caching); request keys are opaque strings chosen by the worker."""

    config: Any
    eos_token_ids: tuple[int, ...]
    kv_cache_dtype: str
    # True where `advance()` returns while the device still runs the step it launched (CUDA):
    # the worker then sends, drains and plans in that step's shadow. Else it calls `step()`.
    overlaps_device: bool
    # True where the engine says which step it read back (`last_step`, with its plan and
    # timings for the step log); False where one call is one whole step (echo, vLLM), and the
    # worker times the call itself.
    reports_steps: bool
    # the engine's draft-free speculation (`scheduler.speculation`), or None where the engine does
    # not speculate (echo, vLLM): the worker then serves predictions as plain requests
    speculator: Any

    def add_request(self, request_id: str, prompt_token_ids: list[int], params,
                    arrival_time: float = 0.0, priority: int = 0,
                    deadline: float = 0.0) -> str | None:
        """Queue a request; a reason string (and nothing queued) when it can never be served.
        `deadline`: its TTFT deadline, time.monotonic() seconds (0: none); an engine without a
        deadline order ignores it."""

    def abort(self, request_id: str):
        """Drop a request and free its KV; its final ABORT record, or None if unknown."""

    def has_unfinished(self) -> bool: ...

    @property
    def request_ids(self) -> list[str]: ...

    def step(self) -> list:
        """One whole step; the records of the requests that advanced or finished."""

    def advance(self) -> list:
        """Launch the next step and read back the previous one (see `overlaps_device`)."""

    def settle(self) -> list:
        """Read back the step in flight without launching another (shutdown)."""

    def launch_deadline(self) -> float | None:
        """perf_counter time by which the next step must launch, or None: at once."""

    @property
    def last_step(self):
        """The step read back by the last call (`reports_steps`), else None."""

    def load(self) -> EngineLoad: ...

    def prefix_cache_probe(self) -> Callable[[int], bool] | None:
        """A function telling whether a prefix block hash is cached here (for the gateway's
        placement), or None when the engine cannot say (prefix caching off, or not ours)."""

    def kv_port(self, model_name: str):
        """Prefix pull's access to the engine's KV blocks (`backend.kv.transfer.KVPort`, issue
        34), or None where the engine cannot pull or serve blocks (not ours, no prefix cache)."""

    def configure_pins(self, budget_fraction: float) -> None:
        """The share of the KV blocks prefix pins may hold (engines without pins ignore it)."""

    def request_pin(self, request_id: str, token_ids: list[int], num_tokens: int,
                    ttl_s: float) -> bool | None:
        """Pin a request's prompt prefix for `ttl_s`: True pinned, False over the pin budget,
        None where the engine cannot pin (no prefix cache, not ours)."""

    def record_kv_events(self) -> bool:
        """Start recording prefix-cache changes (KV events in vLLM's format, issue 33); False
        where the engine has no prefix cache of its own to report."""

    def take_kv_events(self) -> list:
        """The changes recorded since the last call (empty when none or not recording)."""

    def check_integrity(self) -> None:
        """Assert the engine's books balance (called while idle: no request, every block free)."""


REQUIRED = ("config", "eos_token_ids", "kv_cache_dtype", "overlaps_device", "reports_steps",
            "speculator",
            "add_request", "abort", "has_unfinished", "request_ids", "step", "advance", "settle",
            "launch_deadline", "last_step", "load", "prefix_cache_probe", "kv_port", "configure_pins",
            "request_pin", "record_kv_events", "take_kv_events", "check_integrity")


class WholeStepEngine:
    """The contract's defaults for an engine where one call is one whole step and whose KV is
    not ours to report, pin or pull (echo, vLLM): they subclass this and write only requests,
    `step` and `load`. Our engine (`continuous.Engine`) implements every member itself."""

    overlaps_device = False  # nothing runs after step() returns: nothing to overlap
    kv_cache_dtype = "auto"
    reports_steps = False    # the worker times each call itself
    speculator = None        # drafts are ours alone: predictions are served as plain requests
    last_step = None

    @property
    def serving_info(self) -> dict:
        return {}  # no serving transforms: nothing for the start-up line

    def step(self) -> list:
        raise NotImplementedError

    def advance(self) -> list:
        return self.step()

    def settle(self) -> list:
        return []

    def launch_deadline(self) -> float | None:
        return None

    def configure_pins(self, budget_fraction: float) -> None:
        return None  # no prefix pins

    def request_pin(self, request_id, token_ids, num_tokens, ttl_s) -> bool | None:
        return None

    def record_kv_events(self) -> bool:
        return False  # no prefix cache of ours (vLLM's engine publishes its own, server/cli.py)

    def take_kv_events(self) -> list:
        return []

    def prefix_cache_probe(self):
        return None  # no prefix cache whose block hashes are ours

    def kv_port(self, model_name: str):
        return None  # no pool of ours to pull into or serve from


def missing_members(engine) -> list[str]:
    """The members of the contract an engine object lacks (empty: it implements it)."""
    return [name for name in REQUIRED if not hasattr(engine, name)]
