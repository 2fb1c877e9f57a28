"""`tidegate backend ...`: serve a model over ZeroMQ, or `tidegate backend profile` it.

    tidegate backend --listen tcp://127.0.0.1:5555 --model tiny
    tidegate backend profile --model deepseek-coder-33b --device cuda --out profile.json

Errors a user can cause (bad model, no memory, socket in use) print one line and exit 1.
SIGTERM/SIGINT while it starts (model load, CUDA graphs, warm-up, bind) stop it once the step in
progress returns: one line, exit 0 (`_StartupSignals`); once it serves, the worker drains.
"""
from __future__ import annotations

import argparse
import gc
import signal
import sys

from backend.engine.args import add_engine_args, backend_config
from backend.errors import ModelLoadError
from engine_flags import add_engine_kind_args, add_serving_args
from scheduler.kv_cost import PullConfig

DEFAULT_LISTEN = "tcp://127.0.0.1:5555"


ROLES = ("mixed", "prefill", "decode")  # BackendInfo.Role's values, in order
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _StoppedDuringStartup(Exception):
    pass


class _StartupSignals:
    """SIGTERM/SIGINT from main's first line until the worker's own handlers take them over.

    Before, SIGINT raised KeyboardInterrupt wherever start-up was (a traceback out of an import or
    the model load, exit -2) and SIGTERM killed the process (-15): a supervisor or ^C that stops a
    backend still loading saw a crash, where the gateway stops there with exit 0. Now a signal is
    only noted; `check()` at the safe points between start-up's steps (after the imports, the
    engine build -- load, graphs, warm-up --, the KV event socket, the worker's bind) stops it, so
    nothing is interrupted half-way (a graph capture, a collective of the tensor-parallel ranks, a
    bind). A stop therefore waits for the step in progress: minutes of a large model's load.

    SA_RESTART (`siginterrupt(sig, False)`): nothing here needs the main thread woken early, and
    with it the calls the kernel restarts (reads, writes, waits) do not fail with EINTR inside the
    C code of the load (torch, NCCL/gloo rendezvous, libzmq) for a signal we only note. The
    worker's `signal.signal` takes each over in one sigaction (and without SA_RESTART, as before):
    never SIG_DFL in between (gateway.stop_signals explains that window)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> _StartupSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
            signal.siginterrupt(sig, False)
        return self

    def _on_signal(self, signum: int, frame) -> None:
        # note it and return: a handler that did more recursed under a storm (gateway.stop_signals)
        if self.received is None:
            self.received = signum

    def check(self) -> None:
        if self.received is not None:
            raise _StoppedDuringStartup(signal.Signals(self.received).name)

    def restore(self) -> None:
        """The handlers from before main (start-up failed with exit 1; main may run in-process)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate backend",
                                description="Serve one model over ZeroMQ (subcommand: profile).")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help=f"ZMQ endpoint to bind (default {DEFAULT_LISTEN})")
    p.add_argument("--backend-id", default=None, help="stable id for logs and LoadReports")
    p.add_argument("--served-model-name", default=None, help="model name in BackendInfo")
    p.add_argument("--role", choices=ROLES, default="mixed",
                   help="mixed: prefill and decode; prefill: a prefill-only backend of "
                        "disaggregated serving (the gateway sends it the Slow class's long "
                        "prefills, a decode backend pulls their KV: issue 34); decode: says so")
    p.add_argument("--kv-pull-timeout", type=float, default=PullConfig.timeout_s,
                   help="hard deadline of a prefix pull from a peer when the request names "
                        "none, seconds; past it the request recomputes (default "
                        f"{PullConfig.timeout_s:g})")
    p.add_argument("--no-kv-pull-checksum", action="store_true",
                   help="send pulled KV blocks without a crc32 per frame (the receiver checks "
                        "sizes and layout only); for links that checksum themselves")
    p.add_argument("--kv-pull-transport", choices=("zmq", "cuda-ipc"), default="zmq",
                   help="zmq: pulled blocks travel as raw frames (device -> host -> socket); "
                        "cuda-ipc: ask peers on this host to lend their pages by CUDA IPC and "
                        "copy them device to device (a CUDA backend; a peer that cannot answers "
                        "with frames; backend.kv.cuda_ipc)")
    p.add_argument("--kv-pull-serve", choices=("thread", "loop"), default="thread",
                   help="thread: answer peers' prefix pulls on a KV socket of their own, in a "
                        "thread, while this backend steps, and hold a step up to "
                        "--kv-pull-land-wait for a pull of ours about to land; loop: answer "
                        "them between two steps on the main socket (the 1.3 behaviour)")
    p.add_argument("--kv-listen", default=None, metavar="ENDPOINT",
                   help="the KV socket's endpoint (default: next to --listen: ipc://X.kv, "
                        "or tcp on the same host, a free port)")
    p.add_argument("--kv-pull-land-wait", type=float, default=PullConfig.land_wait_s,
                   metavar="SECONDS", help="the most a busy backend holds its next step for a "
                   f"pull expected to land in time (default {PullConfig.land_wait_s:g})")
    sec = p.add_argument_group("security (proto.security)")
    sec.add_argument("--curve-key", default=None, metavar="FILE",
                     help="CURVE key pair (a .key_secret file from `tidegate keys generate`): "
                     "encrypt and authenticate a tcp:// listen address")
    sec.add_argument("--curve-allow", default=None, metavar="DIR",
                     help="directory of client public keys allowed to connect (default: any "
                     "client that knows this backend's public key)")
    sec.add_argument("--insecure", action="store_true",
                     help="allow a non-loopback tcp:// listen address without CURVE keys")
    mh = p.add_argument_group("tensor parallelism over several hosts (backend.server.ranks; "
                              "the same engine flags on every host)")
    mh.add_argument("--tp-nodes", type=int, default=1, metavar="K",
                    help="hosts the --tensor-parallel-size ranks span, N/K on each (default 1)")
    mh.add_argument("--tp-node-rank", type=int, default=0, metavar="J",
                    help="this host's index: 0 serves (--listen) and hosts the rendezvous; "
                         "J > 0 only runs its ranks (default 0)")
    mh.add_argument("--tp-rendezvous", default=None, metavar="HOST:PORT",
                    help="host 0's address and the fixed port of its rendezvous store")
    add_engine_args(p)
    add_engine_kind_args(p)
    add_serving_args(p.add_argument_group(
        "serving (backend.runner.serving, backend.runner.cuda_graphs, backend.model.quantization)"))
    return p


def main(argv: list[str] | None = None) -> int:
    startup = _StartupSignals().install()  # first: a stop signal during start-up is only noted
    argv = list(sys.argv[1:] if argv is None else argv)
    args = serve_parser().parse_args(argv)
    ranks = None  # the other tensor-parallel ranks (backend.server.ranks)
    kv_events = worker = None
    if args.tp_node_rank > 0:  # a host of a multi-host group that serves nothing itself
        from backend.server.ranks import node_main

        if startup.received is not None:
            return _stopped(signal.Signals(startup.received).name)
        startup.restore()  # node_main owns its signals, as before
        try:
            return node_main(backend_config(args), _serving_options(args),
                             args.tensor_parallel_size, _hosts(args))
        except ModelLoadError as exc:
            print(f"tidegate backend: error: {exc}", file=sys.stderr)
            return 1
    try:
        from backend.engine.assemble import default_cpu_threads
        from backend.server.affinity import apply_cpu_affinity

        try:
            apply_cpu_affinity(args.cpu_affinity, args.device,
                               args.cpu_threads or default_cpu_threads())
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        startup.check()
        import zmq

        from backend.engine.assemble import create_engine
        from backend.server.step_log import StepLog
        from backend.server.worker import Worker
        from proto.security import SecurityError, check_bind, keys_from_args

        try:
            keys = keys_from_args(args.curve_key, None, args.curve_allow)
            check_bind(args.listen, keys, args.insecure)
        except SecurityError as exc:
            raise ModelLoadError(str(exc)) from None
        if args.engine == "vllm" and args.tensor_parallel_size != 1:
            raise ModelLoadError("--engine vllm with --tensor-parallel-size: not supported "
                                 "(vLLM's engine has its own tensor parallelism)")
        if args.engine == "vllm":
            from backend.engine.vllm import create_vllm_engine

            engine, loaded = create_vllm_engine(backend_config(args), args.vllm_kv_gib,
                                                args.enforce_eager, _vllm_kv_events(args))
            serving = ", vLLM's engine"
        elif args.tensor_parallel_size != 1 or args.tp_nodes != 1:
            from backend.server.ranks import start_tp_engine

            engine, loaded, info, ranks = start_tp_engine(
                backend_config(args), _serving_options(args), args.tensor_parallel_size,
                _hosts(args))
            serving = _serving_note(info) + f", tensor-parallel {info['tensor_parallel']}"
        else:
            engine, loaded = create_engine(backend_config(args), _serving_options(args))
            serving = _serving_note(engine.serving_info)
            if getattr(engine, "async_scheduling", False):
                serving += ", async scheduling"
        startup.check()  # the longest step (load, graphs, warm-up) has returned
        from backend.model.generation_config import load_generation_defaults

        generation_defaults = load_generation_defaults(args.generation_config, args.model)
        # vLLM's engine publishes its own (create_vllm_engine)
        kv_events = (_kv_event_publisher(args, engine.config.block_size)
                     if args.engine != "vllm" else None)
        startup.check()
        try:
            step_log = StepLog(args.step_log) if args.step_log else None
            worker = Worker(engine, loaded, args.listen, args.backend_id, args.served_model_name,
                            security=keys, step_log=step_log,
                            max_held_messages=args.max_held_messages,
                            generation_defaults=generation_defaults, kv_events=kv_events,
                            pin_budget_fraction=getattr(args, "pin_budget_fraction", 0.25),
                            role=ROLES.index(args.role), kv_pull_timeout_s=args.kv_pull_timeout,
                            kv_pull_checksum=not args.no_kv_pull_checksum,
                            kv_serve=args.kv_pull_serve, kv_listen=args.kv_listen,
                            kv_pull_land_wait_s=args.kv_pull_land_wait,
                            kv_pull_ipc=args.kv_pull_transport == "cuda-ipc")
        except zmq.ZMQError as exc:
            if kv_events is not None:
                kv_events.close()
            raise ModelLoadError(f"cannot listen on {args.listen}: {exc}") from None
        except ValueError as exc:  # KV events asked of an engine without a prefix cache
            if kv_events is not None:
                kv_events.close()
            raise ModelLoadError(str(exc)) from None
        worker.install_signal_handlers()  # ours -> the worker's: one sigaction each
        startup.check()  # one that came since the last check: the worker never serves
    except ModelLoadError as exc:
        print(f"tidegate backend: error: {exc}", file=sys.stderr)
        if ranks is not None:
            ranks.stop()
        startup.restore()
        return 1
    except _StoppedDuringStartup as exc:
        bound = []  # endpoints bound so far: their ipc:// files go with them
        if kv_events is not None:
            bound += [kv_events.endpoint, kv_events.replay_endpoint]
        if worker is not None:
            bound += [worker.endpoint, worker.kv_server and worker.kv_server.endpoint]
            worker.close()  # its sockets, KV server thread, authenticator, KV events
        elif kv_events is not None:
            kv_events.close()
        _unlink_ipc(bound)
        if ranks is not None:
            ranks.stop()
        return _stopped(str(exc))
    if ranks is not None:
        ranks.arm()
    # Everything built so far (modules, parameters, graphs: ~300k objects for the 33B preset) lives
    # as long as the process: out of the cyclic collector's reach, so that a full collection
    # during serving does not rescan it (one took ~0.34 s of CPU here, on a loaded core; the H200
    # serving run logged lone 133 and 181 ms decode steps at batch 256).
    gc.collect()
    gc.freeze()
    cfg = engine.config
    print(f"tidegate backend ready on {worker.endpoint} (model {worker.model_name}, "
          f"{loaded.device}, {str(loaded.dtype).removeprefix('torch.')}, {cfg.num_blocks} KV blocks "
          f"of {cfg.block_size}, max_model_len {cfg.max_model_len}{serving})", flush=True)
    rc = worker.serve_forever()
    worker.ignore_signals()  # drained: a late signal must not turn this exit code into a kill
    # its listeners are closed: their ipc:// files go too (libzmq leaves them, `_unlink_ipc`)
    _unlink_ipc([worker.endpoint, worker.kv_server and worker.kv_server.endpoint]
                + ([kv_events.endpoint, kv_events.replay_endpoint] if kv_events is not None else []))
    if ranks is not None:  # 1 when a rank died (its requests were answered with errors)
        rc = ranks.stop() or rc
    return rc


def _stopped(name: str) -> int:
    """A stop signal during start-up: one line, exit 0 (as the gateway). Ends on SIG_IGN, as the
    worker does after its drain: interpreter finalization would reset our Python-level handlers to
    SIG_DFL, and a supervisor's second signal would turn this 0 into a kill."""
    print(f"tidegate backend: {name} during start-up: stopped before serving", file=sys.stderr,
          flush=True)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    return 0


def _unlink_ipc(endpoints: list[str | None]) -> None:
    """Remove the files of closed ipc:// listeners: libzmq (4.3.5 here) leaves them behind on
    close, unbind and term alike (it removes a stale one at the next bind)."""
    import contextlib
    import os

    for endpoint in endpoints:
        if endpoint and endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
            with contextlib.suppress(OSError):
                os.unlink(endpoint[len("ipc://"):])


def _vllm_kv_events(args: argparse.Namespace) -> dict | None:
    """--kv-events-* for `--engine vllm`: vLLM's own KVEventsConfig fields."""
    if not getattr(args, "kv_events_endpoint", None):
        return None
    if args.kv_events_format != "map":
        raise ModelLoadError("--engine vllm publishes vLLM's own event format: "
                             "--kv-events-format array is ours only")
    if getattr(args, "no_prefix_caching", False):
        raise ModelLoadError("--kv-events-endpoint needs the prefix cache (not --no-prefix-caching)")
    return {"endpoint": args.kv_events_endpoint, "replay_endpoint": args.kv_events_replay_endpoint,
            "topic": args.kv_events_topic}


def _kv_event_publisher(args: argparse.Namespace, block_size: int):
    """--kv-events-endpoint: the publisher (backend.server.kv_events), or None."""
    endpoint = getattr(args, "kv_events_endpoint", None)
    if not endpoint:
        return None
    import zmq

    from backend.server.kv_events import KVEventPublisher

    try:
        return KVEventPublisher(endpoint, block_size, args.kv_events_replay_endpoint,
                                args.kv_events_topic, args.kv_events_format)
    except ImportError:
        raise ModelLoadError("--kv-events-endpoint needs msgpack "
                             "(pip install 'tidegate[kv-events]')") from None
    except zmq.ZMQError as exc:
        raise ModelLoadError(f"--kv-events-endpoint {endpoint}: {exc}") from None


def _hosts(args: argparse.Namespace):
    from backend.server.ranks import MultiHost

    return MultiHost(args.tp_nodes, args.tp_node_rank, args.tp_rendezvous)


def _serving_options(args: argparse.Namespace):
    """--quantization, then CUDA graphs, captured now, at start-up (`ServingOptions`)."""
    from backend.engine.assemble import ServingOptions

    return ServingOptions(args.quantization or "none", args.enforce_eager, args.cuda_graph_buckets,
                          args.cuda_graph_token_buckets, capture=True,
                          async_scheduling=False if getattr(args, "no_async_scheduling", False)
                          else None, fp8_gemv_max_m=getattr(args, "fp8_gemv_max_m", None))


def _serving_note(info: dict) -> str:
    """The ready line's note on the serving transforms (empty for echo and vLLM's engine)."""
    note = f", {info['quantization']} weights" if info.get("quantization", "none") != "none" else ""
    if "quantize_freed_bytes" in info:  # CUDA: what quantizing gave back to the KV pool's sizing
        note += (f" ({info['quantize_freed_bytes'] / 2**30:.1f} GiB freed, "
                 f"{info['quantize_cache_held_bytes'] / 2**30:.2f} GiB kept in torch's cache)")
    if "fp8_gemv_max_m" in info:  # which rows ran the weight-only GEMV (a profile holds for one switch)
        note += f", GEMV up to {info['fp8_gemv_max_m']} rows"
    if info.get("cuda_graphs"):
        mem = info.get("capture_mem", {}).get("free_bytes_used")
        note += (f", {len(info['buckets'])} decode + {len(info['token_buckets'])} mixed-step "
                 f"CUDA graphs captured in {info['capture_s']:.1f} s"
                 + (f" ({mem / 2**20:.0f} MiB)" if mem is not None else ""))
    return note


if __name__ == "__main__":
    sys.exit(main())
