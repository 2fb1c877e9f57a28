"""The engine's command-line flags, defined once for every command that builds or starts an engine.

`tidegate backend` adds them to its parser; `tidegate serve` adds the same definitions for its
embedded backend and hands back, as argv, exactly the ones the user gave (`forwarded_argv`), so
the backend applies its own defaults and a flag added here reaches both commands at once. The
engine benchmark, `tidegate backend profile` and `tidegate eval` take the engine part
(`add_engine_args`).

A torch-free leaf (stdlib and `scheduler.capacity` only): the gateway process may import it, and
turning the parsed flags into a `BackendConfig` stays in `backend.engine.args`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.capacity import add_capacity_arguments, add_prefill_cap_arguments
from scheduler.speculation import add_speculation_arguments

REPO_ROOT = Path(__file__).resolve().parents[1]
# backend.runner.cuda_graphs.DEFAULT_BUCKETS / DEFAULT_TOKEN_BUCKETS (a test keeps them equal)
DEFAULT_CUDA_GRAPH_BUCKETS = "1,2,4,8,16,24,32,48,64,96,128,160,192,224,256"
DEFAULT_CUDA_GRAPH_TOKEN_BUCKETS = ("16,32,48,64,96,128,192,256,320,384,512,576,640,768,896,1024,"
                                    "1152,1280,1408,1536,1664,1792,1920,2048")


def default_model() -> str:
    """The repo's trained tiny coder when it is there, else the `tiny` preset (what
    `tidegate serve` and `tidegate eval speed` run when no --model is given)."""
    tiny_coder = REPO_ROOT / "models" / "tiny-coder"
    return str(tiny_coder) if (tiny_coder / "config.json").is_file() else "tiny"


def int_list(text: str) -> list[int]:
    """A comma-separated list of ints from a flag ("1,8,32"); empty items are skipped."""
    return [int(x) for x in text.split(",") if x.strip()]


def add_engine_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Model, dtype, device, KV pool and batching capacity: what `backend.engine.args.backend_config`
    reads."""
    p.add_argument("--model", default="tiny", help="HF model directory or preset name (default: tiny)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy", "dummy-cycle", "safetensors"],
                   help="auto: safetensors for a directory, random weights for a preset; dummy-cycle: random "
                        "weights whose greedy output walks a fixed token cycle (stable under any "
                        "summation order: the speculation oracle's benchmarks)")
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
                        "int4-fp8 (INT4 keys with per-group scales, E4M3 values); on CUDA the "
                        "Triton attention kernels and graphs read quantized pages directly")
    add_capacity_arguments(p)
    add_prefill_cap_arguments(p)
    p.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    p.add_argument("--waiting-by-class", action="store_true",
                   help="admit waiting requests by the class of their max_tokens (Fast, Normal, "
                   "Slow; FCFS within one) instead of FCFS, as the gateway's admission and "
                   "classes assume and the echo engine does (issue 31; default: FCFS)")
    p.add_argument("--deadline-order", action="store_true",
                   help="the waiting request with the earliest TTFT deadline (sent by `tidegate "
                   "serve --send-deadlines`) takes a free slot before the class order's next one "
                   "when it would miss its deadline waiting for the next slot and that one would "
                   "not (scheduler.deadline_order; issue 31, s17; default: off)")
    p.add_argument("--deadline-margin-ms", type=float, default=0.0,
                   help="with --deadline-order: extra room asked on both sides of that "
                   "comparison (default 0, scheduler.deadline_order.DEFAULT_MARGIN_S)")
    p.add_argument("--host-kv-gib", type=float, default=0.0,
                   help="host memory (GiB) for a second KV tier: evicted prefix blocks and "
                        "swapped-out preempted sequences (pinned on CUDA); 0: none (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of random (dummy) weights")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads on the CPU (default: half the cores, at most 8)")
    p.add_argument("--echo-step-ms", type=float, default=0.0,
                   help="--model echo only: one step every this many ms, sleeping (a backend "
                   "that is slow without burning a core: chaos and soak tests, a constant "
                   "step for the simulator)")


def add_engine_kind_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Whose engine steps the model in a serving backend."""
    p.add_argument("--engine", default="tidegate", choices=["tidegate", "vllm"],
                   help="whose engine steps the model: ours, or vLLM's in this process "
                        "(pip install tidegate[vllm]; --model must be a HF directory)")
    p.add_argument("--vllm-kv-gib", type=float, default=None,
                   help="--engine vllm on the CPU: its KV space in GiB (VLLM_CPU_KVCACHE_SPACE; "
                        "default 1)")


def add_serving_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """What a serving backend does to its engine after building it (`backend.runner.serving`:
    weight quantization, CUDA graphs) and what it records while it serves."""
    p.add_argument("--quantization", default="none", choices=["none", "fp8"],
                   help="fp8: E4M3 weights, per-output-channel scales (CUDA, capability >= 8.9)")
    p.add_argument("--fp8-gemv-max-m", type=int, default=None, metavar="ROWS",
                   help="fp8 weights: the most rows a linear runs on the weight-only Triton GEMV; "
                        "more go to per-token fp8 + torch._scaled_mm (W8A8). A decode step's rows are "
                        "its CUDA graph's bucket (default 16: through the service, decode steps of 17-32 "
                        "sequences run 3.5-6.3 %% faster than at 32, the earlier default; "
                        "bench/results/pairs_s41)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs: every step runs eagerly")
    p.add_argument("--cpu-affinity", default="none", metavar="auto|none|CORES",
                   help="CPU engine: pin its threads (backend.server.affinity): auto = the last "
                        "--cpu-threads cores when a core is left over for the rest (`tidegate "
                        "serve` starts its embedded backend so), or cores such as 1 or 2-3")
    add_speculation_arguments(p)
    p.add_argument("--generation-config", default="auto", metavar="auto|none|DIR",
                   help="the model's sampling defaults, as vLLM's flag: auto reads the model "
                        "directory's generation_config.json (temperature, top_p, top_k, min_p, "
                        "repetition/presence/frequency penalties; max_new_tokens caps max_tokens) "
                        "for the fields a request leaves out; none: the API's defaults; DIR: "
                        "that directory's file (backend.model.generation_config; default auto)")
    p.add_argument("--cuda-graph-buckets", default=None,
                   help=f"decode batch sizes to capture (default {DEFAULT_CUDA_GRAPH_BUCKETS}; "
                        "those above --max-num-seqs are dropped; 'none': decode steps eager)")
    p.add_argument("--cuda-graph-token-buckets", default=None,
                   help="scheduled-token counts of the mixed prefill+decode step graphs "
                        f"(default {DEFAULT_CUDA_GRAPH_TOKEN_BUCKETS}; those above "
                        "--max-num-batched-tokens are dropped; 'none': mixed steps eager)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split the model over N devices (cuda:0..N-1 for --device cuda; N "
                   "processes over gloo on the CPU): one process per rank, the scheduler on "
                   "rank 0 (backend.server.ranks; default 1)")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="plan each step only after the previous one's tokens are read back "
                        "(default on CUDA: the next step is planned and launched while the "
                        "device runs the current one; backend.engine.continuous)")
    p.add_argument("--max-held-messages", type=int, default=4096,
                   help="messages held for a gateway whose socket queue is full; past this it "
                   "is not reading: its requests are aborted and it is forgotten")
    p.add_argument("--kv-events-endpoint", default=None, metavar="ZMQ",
                   help="publish KV cache events in vLLM's format (BlockStored, BlockRemoved, "
                        "AllBlocksCleared; msgpack over a PUB socket) for KV-aware routers: "
                        "tcp://*:5557 binds, tcp://HOST:PORT connects (vLLM's rule; "
                        "backend.server.kv_events; default: off)")
    p.add_argument("--kv-events-replay-endpoint", default=None, metavar="ZMQ",
                   help="ROUTER address serving missed event batches by sequence number "
                        "(vLLM's replay_endpoint; default: none)")
    p.add_argument("--kv-events-topic", default="", metavar="TOPIC",
                   help="the topic frame of every event message (vLLM's topic; default empty)")
    p.add_argument("--kv-events-format", default="map", choices=["map", "array"],
                   help="map: events as tagged maps (vLLM since 2026-06, PR 42892); array: the "
                        "earlier positional events, for consumers not updated since")
    p.add_argument("--pin-budget-fraction", type=float, default=0.25, metavar="F",
                   help="the most of the KV blocks prefix pins (cache_control with a ttl) may "
                        "hold; a request over it is served unpinned and told so (default 0.25; "
                        "docs/sessions.md)")
    p.add_argument("--step-log", default=None, metavar="PATH",
                   help="write one JSON line per engine step (wall start, duration, decodes, "
                        "prefill tokens) to PATH when the backend stops (benchmarks)")


def add_backend_engine_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Every engine flag of `tidegate backend`."""
    add_engine_args(p)
    add_engine_kind_args(p)
    add_serving_args(p)


def add_forwarded_engine_args(parser: argparse.ArgumentParser,
                              title: str) -> list[argparse.Action]:
    """Every engine flag of `tidegate backend`, in a group of `parser` whose flags default to
    absent: the parsed namespace holds only what the user gave (see `forwarded_argv`)."""
    group = parser.add_argument_group(title)
    add_backend_engine_args(group)
    actions = list(group._group_actions)
    for action in actions:
        action.default = argparse.SUPPRESS
    return actions


def forwarded_argv(args: argparse.Namespace, actions: list[argparse.Action]) -> list[str]:
    """The flags among `actions` present in `args`, written back as `tidegate backend` argv."""
    argv: list[str] = []
    for action in actions:
        if not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        flag = action.option_strings[0]
        if action.nargs == 0:  # store_true: present means on
            if value:
                argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv
