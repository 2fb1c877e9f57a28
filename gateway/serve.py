"""`tidegate serve`: the OpenAI-compatible HTTP gateway on uvloop.

    tidegate serve                                   # embedded: one tiny backend on the CPU
    tidegate serve --backend tcp://10.0.0.5:5555 --backend tcp://10.0.0.6:5555

`--backend embedded` (the default) starts `tidegate backend` as a subprocess on an `ipc://`
socket in a private temp dir, waits for its BackendInfo, and stops it with the gateway. Every
engine flag of `tidegate backend` (`engine_flags`: model, device, dtype, KV pool, capacity,
quantization, CUDA graphs, ...) is a flag of `serve` too and is passed to it as given; the
backend applies its own defaults to the rest. SIGTERM/SIGINT: new requests get 503,
in-flight ones get `--drain-timeout` seconds to finish, then the process exits 0 (more signals
during or after the drain change nothing: gateway.stop_signals); one during start-up stops it
there, exit 0.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

# Only what parsing the command line needs is imported here: `main` starts the embedded backend
# (whose `import torch` is the long pole of start-up) before the gateway's own modules (aiohttp,
# the app, the pool: ~0.9 s) are imported, so the two overlap on a multi-core machine.
from engine_flags import add_forwarded_engine_args, default_model, forwarded_argv
from gateway.discovery import add_discovery_arguments, discovery_ctx, sources_from_args
from gateway.stop_signals import StopSignals
from gateway.validation import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, RequestLimits
from scheduler.admission import add_overtake_arguments
from scheduler.batcher import BatcherConfig
from scheduler.capacity import DEFAULT_CAPACITY
from scheduler.kv_cost import PullConfig
from scheduler.placement import add_placement_arguments, placement_config_from_args
from tokenizer.fim import FimTemplate

if TYPE_CHECKING:
    from aiohttp import web

    from gateway.core import GatewayConfig

log = logging.getLogger("tidegate.serve")
REPO_ROOT = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate serve", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0: any free port)")
    p.add_argument("--backend", action="append", default=None, metavar="ADDR",
                   help="backend address, repeatable: tcp://… or ipc://… (our wire), http://… (any "
                        "OpenAI-compatible server: vllm serve, SGLang, tidegate), or 'embedded'")
    p.add_argument("--workers", type=int, default=1,
                   help="gateway processes sharing the port (SO_REUSEPORT), each with its own "
                        "window, queues and placement (gateway.workers)")
    p.add_argument("--admin-key", default=None,
                   help="enables /admin/backends (add, drain, remove backends while serving) "
                        "behind 'Authorization: Bearer KEY' (or TIDEGATE_ADMIN_KEY)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="HF model directory whose tokenizer http:// backends are given (a ZMQ "
                        "backend sends its own; an HTTP server cannot)")
    p.add_argument("--served-model-name", default=None, help="model name in the API "
                   "(default: the backend's)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' "
                   "(every route but /health; the front door's Hello too). Visible in `ps`: "
                   "prefer --api-key-file or the TIDEGATE_API_KEY environment variable")
    p.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="read the API key from FILE (first line)")
    sec = p.add_argument_group("ZeroMQ security (proto.security; keys from `tidegate keys "
                               "generate`)")
    sec.add_argument("--curve-key", default=None, metavar="FILE",
                     help="this gateway's CURVE key pair (.key_secret): its identity towards "
                     "tcp:// backends and the front door's server key")
    sec.add_argument("--backend-key", default=None, metavar="FILE",
                     help="public key file of the tcp:// backends (needs --curve-key)")
    sec.add_argument("--curve-allow", default=None, metavar="DIR",
                     help="front door: directory of client public keys allowed to connect")
    sec.add_argument("--insecure", action="store_true",
                     help="allow a non-loopback tcp:// front door without CURVE keys")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-prompts", action="store_true", help="include prompt text in request logs")
    p.add_argument("--slo-ttft-ms", default=None, metavar="MS|CLASS=MS,...",
                   help="time-to-first-token target, for every class or per class "
                        "(fast=200,normal=1000,slow=4000): SLO attainment per class in /metrics, "
                        "and admission that refuses at once (429, Retry-After = the predicted "
                        "wait) a request predicted to miss it. `tidegate sim slo` proposes "
                        "targets from a trace")
    p.add_argument("--slo-tpot-ms", default=None, metavar="MS|CLASS=MS,...",
                   help="time-per-output-token target, as --slo-ttft-ms (attainment only)")
    p.add_argument("--slot-model", action="store_true",
                   help="predict waits from the running requests' ends (slot-bound backends "
                   "that serve Fast first, as echo backends: scheduler.admission, Slots)")
    p.add_argument("--compete-window", action="store_true",
                   help="with --slot-model: a Slow request's free slot is contested by the Fast "
                   "and Normal arrivals during its batching window too, not only until the "
                   "backend's next step (AdmissionConfig.compete_window; for long windows)")
    p.add_argument("--retry-after-quantile", type=float, default=None, metavar="Q",
                   help="with --slot-model: a refusal's Retry-After is this quantile (0.5: the "
                   "median) of its wait over admission's futures of the Fast and Normal "
                   "arrivals, not the wait with them at their mean "
                   "(AdmissionConfig.retry_after_quantile)")
    add_overtake_arguments(p)
    p.add_argument("--send-deadlines", action="store_true",
                   help="send each request's TTFT deadline (its arrival + its TTFT target) to its "
                   "backend, which with `tidegate backend --deadline-order` starts a waiting "
                   "request near its deadline before higher classes (scheduler.deadline_order; "
                   "AdmissionConfig.send_deadlines; opt-in)")
    p.add_argument("--stream-interval", type=int, default=1, help="stream every N tokens")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds; then 504")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds on SIGTERM")
    p.add_argument("--stream-stall-timeout", type=float, default=30.0,
                   help="seconds a streaming client may take no bytes before it counts as gone "
                        "(its requests aborted, the connection closed)")
    p.add_argument("--startup-timeout", type=float, default=120.0,
                   help="seconds to wait for the embedded backend")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="a backend silent this long is marked down")
    p.add_argument("--max-inflight-per-backend", type=int, default=256,
                   help="requests in flight on one backend; more wait in the class queues")
    add_placement_arguments(p)
    p.add_argument("--kv-pull", action="store_true",
                   help="prefix pull between backends (issue 34): a request placed on a backend "
                        "lacking a prefix another holds is sent with that peer as its KV source "
                        "when the measured rates say pulling beats recomputing (scheduler.kv_cost)")
    p.add_argument("--kv-pull-timeout", type=float, default=PullConfig.timeout_s,
                   help="hard deadline of one pull, seconds; past it the backend recomputes")
    p.add_argument("--kv-split-margin", type=float, default=PullConfig.split_margin,
                   help="with --kv-pull and a --role prefill backend: split a long Slow prompt's "
                        "prefill onto it when moving its KV (after that backend's queue) takes "
                        f"at most this share of the prefill (default {PullConfig.split_margin:g}; "
                        "0: never)")
    p.add_argument("--kv-split-min-tokens", type=int, default=PullConfig.split_min_tokens,
                   help="shortest prompt ever split (default "
                        f"{PullConfig.split_min_tokens})")
    add_discovery_arguments(p)
    p.add_argument("--kv-events-from", action="append", default=[], metavar="BACKEND=ZMQ[,ZMQ]",
                   help="follow an http:// backend's KV cache events in vLLM's format (vllm serve "
                        "--kv-events-config; a tidegate backend's --kv-events-endpoint): its PUB "
                        "endpoint and optionally its replay endpoint; placement then knows which "
                        "prefixes it holds instead of guessing (gateway.kv_events; repeatable)")
    p.add_argument("--kv-events-from-topic", default="", metavar="TOPIC",
                   help="topic prefix to subscribe to on every --kv-events-from endpoint "
                        "(empty: every topic)")
    p.add_argument("--max-batch-size", type=int, default=128, help="requests per Batch (1..128)")
    p.add_argument("--min-latency-ms", type=float, default=BatcherConfig.min_latency_ms,
                   help="longest batching window (default %(default)s)")
    p.add_argument("--target-throughput", type=float, default=BatcherConfig.target_throughput,
                   help="requests/s: a window waits while arrivals beat this x hysteresis "
                        "(default %(default)s, chosen by `tidegate sim window`: "
                        "docs/window_defaults.md; the design card's 8000 ships every request "
                        "alone)")
    p.add_argument("--hysteresis", type=float, default=0.8)
    p.add_argument("--no-idle-flush", action="store_true",
                   help="keep the window open even when a backend is idle")
    p.add_argument("--max-queue-requests", type=int, default=8192,
                   help="per class queue; more get 429")
    p.add_argument("--queue-policy", default="fifo", choices=["fifo", "priority"])
    p.add_argument("--decision-log", default=None, metavar="FILE",
                   help="append each arrival and each flushed batch window to FILE as JSON lines "
                        "(scheduler.decisions; replayed by `sims.decision_replay`); meant for --workers 1 "
                        "(each worker has its own batcher)")
    p.add_argument("--zmq-listen", default=None,
                   help="also serve the ZMQ front door here (e.g. tcp://127.0.0.1:5556)")
    p.add_argument("--max-stop-strings", type=int, default=MAX_STOP_STRINGS,
                   help="stop strings per request")
    p.add_argument("--max-stop-len", type=int, default=MAX_STOP_STRING_CHARS,
                   help="characters per stop string")
    p.add_argument("--max-n", type=int, default=16, help="choices per prompt ('n')")
    p.add_argument("--strict-api", action="store_true",
                   help="unknown request fields are a 400 (default: logged once per name)")
    p.add_argument("--tool-call-parser", default="auto",
                   choices=("auto", "hermes", "json", "mistral", "pythonic", "deepseek_v3",
                            "deepseek_v32", "qwen3_coder", "glm45", "kimi_k2", "openai", "granite",
                            "internlm"),
                   help="how tool calls are read out of a reply with tool_choice auto: auto (the "
                        "default: the format the model's chat template asks for, else hermes; "
                        "gateway.tools.TEMPLATE_PARSERS), hermes "
                        "(<tool_call> blocks: the generic format tools are shown in when the "
                        "chat template renders none, and Qwen's / Hermes'), json (the reply is "
                        "one JSON call or an array of them: Llama 3's), mistral ([TOOL_CALLS] "
                        "then a JSON array of calls, or name[ARGS]{...} per call: Mistral's; "
                        "for models whose chat template renders the tools), pythonic ([f(a=1), "
                        "g(b='x')]: Llama 3.2's and Llama 4's), deepseek_v3 (DeepSeek-V3 / R1 / "
                        "V3.1), deepseek_v32 (V3.2's DSML), qwen3_coder (Qwen3-Coder's "
                        "<function=f><parameter=x>), glm45 (GLM-4.5 / 4.6 / 4.7), kimi_k2, "
                        "openai (gpt-oss's harmony), granite, internlm; "
                        "docs/structured_output.md)")
    p.add_argument("--fim-template", default=None,
                   help="fill-in-the-middle prompt with {prefix} and {suffix} (default: the "
                        "model family's, found among the tokenizer's special tokens)")
    p.add_argument("--protect-metrics", action="store_true",
                   help="/metrics needs the API key too (default: open, as vLLM's)")
    add_forwarded_engine_args(p, "embedded backend (the flags of `tidegate backend`, passed to it "
                                 "as given; --model defaults to models/tiny-coder if present, "
                                 "else the tiny preset)")
    return p


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key-file, then TIDEGATE_API_KEY, then --api-key (key material stays out of argv
    unless the operator puts it there)."""
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            key = f.readline().strip()
        if not key:
            raise SystemExit(f"tidegate serve: error: {args.api_key_file} holds no key")
        return key
    return os.environ.get("TIDEGATE_API_KEY") or args.api_key


def _http_tokenizer(args: argparse.Namespace):
    if not getattr(args, "tokenizer", None):
        return None
    from pathlib import Path

    from tokenizer.hf_dir import TokenizerFileError, load_hf_dir
    try:
        return load_hf_dir(Path(args.tokenizer))
    except (TokenizerFileError, OSError) as exc:
        raise SystemExit(f"tidegate serve: error: --tokenizer {args.tokenizer}: {exc}") from None


def embedded_backend_argv(args: argparse.Namespace, listen: str) -> list[str]:
    """The `tidegate backend` command line for the embedded backend: its socket, the model, then
    every engine flag the user gave to `serve`."""
    model = getattr(args, "model", None) or default_model()
    engine = add_forwarded_engine_args(argparse.ArgumentParser(add_help=False), "engine")
    rest = forwarded_argv(args, [a for a in engine if a.dest != "model"])
    if not hasattr(args, "cpu_affinity"):  # one engine beside this gateway: its own cores
        rest += ["--cpu-affinity", "auto"]
    return ["backend", "--listen", listen, "--model", model, *rest]


def gateway_config(args: argparse.Namespace, backends: list[str]) -> GatewayConfig:
    from gateway.backend_pool import PoolConfig
    from gateway.core import GatewayConfig
    from proto.security import keys_from_args
    from scheduler.batcher import BatcherConfig
    from scheduler.queues import QueueConfig
    from scheduler.slo import SLOTargets

    q = args.max_queue_requests
    curve = keys_from_args(args.curve_key, args.backend_key, args.curve_allow)
    if args.fim_template:
        FimTemplate(args.fim_template)  # a bad template fails at start-up, not per request
    return GatewayConfig(
        backends=tuple(backends), served_model_name=args.served_model_name,
        api_key=api_key(args), max_body_bytes=args.max_body_bytes,
        admin_key=os.environ.get("TIDEGATE_ADMIN_KEY") or args.admin_key,
        request_timeout_s=args.request_timeout, stream_interval=max(1, args.stream_interval),
        log_prompts=args.log_prompts, drain_timeout_s=args.drain_timeout,
        stream_stall_timeout_s=args.stream_stall_timeout,
        slo=SLOTargets.parse(args.slo_ttft_ms, args.slo_tpot_ms), slot_model=args.slot_model,
        compete_window=getattr(args, "compete_window", False),
        retry_after_quantile=getattr(args, "retry_after_quantile", None),
        overtake=getattr(args, "overtake", False),
        overtake_horizon_s=getattr(args, "overtake_horizon_s", None),
        normal_overtake_quantile=getattr(args, "normal_overtake_quantile", None),
        fleet_arrival_rate=getattr(args, "fleet_arrival_rate", False),
        send_deadlines=getattr(args, "send_deadlines", False),
        pool=PoolConfig(heartbeat_timeout_s=args.heartbeat_timeout,
                        max_inflight_per_backend=args.max_inflight_per_backend, curve=curve,
                        # block size: the backends' own, read from their BackendInfo when hashing
                        placement=placement_config_from_args(args, DEFAULT_CAPACITY.block_size),
                        http_tokenizer=_http_tokenizer(args),
                        kv_pull=(PullConfig(timeout_s=args.kv_pull_timeout,
                                            split_margin=args.kv_split_margin,
                                            split_min_tokens=args.kv_split_min_tokens)
                                 if args.kv_pull else None)),
        batcher=BatcherConfig(max_batch_size=args.max_batch_size,
                              min_latency_ms=args.min_latency_ms,
                              target_throughput=args.target_throughput,
                              hysteresis=args.hysteresis, idle_flush=not args.no_idle_flush),
        queues=QueueConfig(max_requests=(q, q, q), policy=args.queue_policy),
        limits=RequestLimits(max_stop_strings=args.max_stop_strings,
                             max_stop_len=args.max_stop_len, max_n=args.max_n,
                             strict_api=args.strict_api),
        fim_template=args.fim_template, protect_metrics=args.protect_metrics,
        tool_call_parser=args.tool_call_parser,
        decision_log_path=getattr(args, "decision_log", None))


class EmbeddedBackend:
    """`tidegate backend` as a child process on a private ipc:// socket."""

    def __init__(self, args: argparse.Namespace, signal_mask: set[int] | None = None) -> None:
        """`signal_mask`: the mask the backend starts with, when the caller's differs (the
        --workers parent blocks SIGTERM/SIGINT, and a child inherits the mask across exec: the
        backend would never see its SIGTERM)."""
        self.tmpdir = tempfile.mkdtemp(prefix="tidegate-")
        self.address = f"ipc://{self.tmpdir}/backend.sock"
        cmd = [sys.executable, "-m", "gateway.tidegate_cli",
               *embedded_backend_argv(args, self.address)]
        log.info("starting embedded backend: %s", " ".join(cmd))
        preexec = None
        if signal_mask is not None:
            def preexec() -> None:  # in the child, before exec
                signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
        # preexec_fn only from the --workers parent, which has started no thread by then
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, preexec_fn=preexec)  # noqa: PLW1509

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


async def _wait_for_backend(app: web.Application, embedded: EmbeddedBackend | None,
                            timeout: float, stop: asyncio.Event) -> bool:
    """True once a backend answers; False if the embedded one exits, on the timeout, or within
    0.2 s of `stop` being set (a signal during start-up)."""
    from gateway.app_keys import GATEWAY_KEY

    pool = app[GATEWAY_KEY].pool
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (left := deadline - loop.time()) > 0 and not stop.is_set():
        if await pool.wait_ready(min(0.2, left)):
            return True
        if embedded is not None and embedded.proc.poll() is not None:
            return False
    return False


async def serve(args: argparse.Namespace, embedded: EmbeddedBackend | None = None,
                signals: StopSignals | None = None) -> int:
    """Run the gateway until SIGTERM/SIGINT. `embedded`: the embedded backend if the caller
    already started it (`_run_one` does, to overlap its start-up with these imports).
    `signals`: SIGTERM/SIGINT's handler, installed by the caller before anything started
    (`_run_one` does, and ignores them at the end whatever happened); installed here if not
    given. Once it has served (or stopped during start-up), serve() leaves them ignored."""
    from aiohttp import web

    from gateway.app import create_app, drain
    from gateway.app_keys import GATEWAY_KEY
    from proto.security import SecurityError, check_bind

    sources = sources_from_args(args)
    backends = args.backend or ([] if sources else ["embedded"])
    if "embedded" in backends:
        if embedded is None:
            embedded = EmbeddedBackend(args)
        backends = [b for b in backends if b != "embedded"] + [embedded.address]
    try:
        config = gateway_config(args, backends)
        if args.zmq_listen:
            check_bind(args.zmq_listen, config.pool.curve, args.insecure)
    except SecurityError as exc:
        print(f"tidegate serve: error: {exc}", file=sys.stderr)
        if embedded is not None:
            embedded.stop()
        return 2
    extra = []
    if args.zmq_listen:
        from gateway.frontdoor import frontdoor_ctx

        extra.append(frontdoor_ctx(args.zmq_listen, config.pool.curve, args.insecure))
    if sources:
        extra.append(discovery_ctx(sources, args.discovery_interval))
    if args.kv_events_from:
        from gateway.kv_events import kv_events_ctx, parse_kv_events_from

        try:
            specs = [parse_kv_events_from(s) for s in args.kv_events_from]
            import msgpack  # noqa: F401 -- the kv-events extra
        except (ValueError, ImportError) as exc:
            print(f"tidegate serve: error: {exc}" if isinstance(exc, ValueError) else
                  "tidegate serve: error: --kv-events-from needs msgpack "
                  "(pip install 'tidegate[kv-events]')", file=sys.stderr)
            if embedded is not None:
                embedded.stop()
            return 2
        extra.append(kv_events_ctx(specs, args.kv_events_from_topic))
    app = create_app(config, extra_cleanup_ctx=extra)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    if signals is None:
        signals = StopSignals().install()
    stop = asyncio.Event()
    # before anything can be waited for; not the loop's add_signal_handler, whose removal (ours
    # or the loop's close) hands the signals back to SIG_DFL: gateway.stop_signals says why
    signals.attach(asyncio.get_running_loop(), stop)
    try:
        await runner.setup()
        gw = app[GATEWAY_KEY]
        log.info("waiting for the backends (up to %.1f s)",
                 args.startup_timeout if embedded is not None else min(args.startup_timeout, 5.0))
        if embedded is None:  # remote backends: give them a moment, never fail on it
            await _wait_for_backend(app, None, min(args.startup_timeout, 5.0), stop)
        elif (not await _wait_for_backend(app, embedded, args.startup_timeout, stop)
              and not stop.is_set()):
            code = embedded.proc.poll()
            print(f"tidegate serve: error: the embedded backend did not start "
                  f"({'exit code ' + str(code) if code is not None else 'timed out'})",
                  file=sys.stderr)
            return 1
        if stop.is_set():  # SIGTERM/SIGINT during start-up: nothing to drain
            log.info("stopping during start-up")
            return 0
        site = web.TCPSite(runner, args.host, args.port,
                           reuse_port=getattr(args, "reuse_port", False) or None)
        await site.start()
        port = site._server.sockets[0].getsockname()[1] if site._server else args.port
        model = gw.model_name if gw.pool.info is not None else "(waiting for a backend)"
        listed = ", ".join([*backends, *(s.name for s in sources)])
        print(f"tidegate serving model {model} on http://{args.host}:{port} "
              f"(backends: {listed})", flush=True)
        if args.zmq_listen:
            print(f"tidegate ZMQ front door on {args.zmq_listen}", flush=True)
        # Everything built so far (modules, tokenizer, app) lives as long as the process: out of
        # the cyclic collector's reach, so its full collections do not rescan it every few
        # thousand requests.
        gc.collect()
        gc.freeze()
        await stop.wait()
        log.info("stopping: draining for up to %.1f s", args.drain_timeout)
        if not await drain(app, args.drain_timeout):
            log.warning("drain timeout: ending the remaining requests")
        return 0
    finally:
        await runner.cleanup()
        if embedded is not None:
            embedded.stop()
        signals.detach()
        signals.ignore()  # drained: a late signal must not turn exit 0 into a kill


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from scheduler.slo import SLOTargets
    try:  # a bad target fails at start-up, with the flag's name
        SLOTargets.parse(args.slo_ttft_ms, args.slo_tpot_ms)
    except ValueError as exc:
        parser.error(f"--slo-ttft-ms/--slo-tpot-ms: {exc}")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.workers > 1:
        from gateway.workers import serve_workers
        return serve_workers(args, _run_one, EmbeddedBackend)
    if args.workers < 1:
        raise SystemExit("tidegate serve: error: --workers must be >= 1")
    return _run_one(args)


def _discovers(args: argparse.Namespace) -> bool:
    return bool(args.endpoints_file or args.discover_dns or args.discover_k8s)


def _run_one(args: argparse.Namespace, signals: StopSignals | None = None) -> int:
    # SIGTERM/SIGINT are ours before anything starts and until the process ends: never their
    # default action in between (gateway.stop_signals). One before the loop runs is remembered.
    # `signals`: already installed (a --workers worker installs them as soon as it is forked).
    if signals is None:
        signals = StopSignals().install()
    # The embedded backend first: it starts (torch, weights) while this process imports the rest.
    default = [] if _discovers(args) else ["embedded"]
    embedded = EmbeddedBackend(args) if "embedded" in (args.backend or default) else None
    try:
        import uvloop
    except ImportError:  # not on Windows
        uvloop = None
    try:
        if uvloop is not None:
            return uvloop.run(serve(args, embedded, signals))
        return asyncio.run(serve(args, embedded, signals))
    finally:
        # serve() ignores them once drained; this covers a failure before or in its set-up
        # (our handler -> SIG_IGN in one call: never SIG_DFL, which interpreter finalization
        # would also restore had a Python-level handler been left installed)
        signals.ignore()
        if embedded is not None:  # serve() stops it; this covers a failure before serve() ran
            embedded.stop()


if __name__ == "__main__":
    sys.exit(main())
