"""`tidegate bench`: the load generator (`serve`) and the GPU engine benchmark (`engine`).

    tidegate bench serve --url http://127.0.0.1:8000 --num-requests 200 --rate 20 \\
        --input-len 512 --output-len uniform:16:256 --slo-ttft-ms 200 --slo-tpot-ms 50 --json out.json
    tidegate bench serve --backend zmq --zmq-url tcp://127.0.0.1:5556 --rate inf --max-concurrency 64
    tidegate bench serve --trace requests.jsonl            # the JSONL format `tidegate sim` reads
    tidegate bench engine ...                              # forwarded to `python -m bench.engine.steps`
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib
import json
import math
import sys

USAGE = """usage: tidegate bench <serve|engine|overhead> [options]

  serve    open-loop load generator against a live OpenAI-compatible server (or --backend zmq):
           TTFT, TPOT, ITL, end-to-end latency, throughput, goodput; a table and --json
  engine   the GPU engine benchmark (bench.engine.steps); its options are its own
  overhead the gateway's own cost: echo backend + gateway vs bare aiohttp and raw pyzmq

Run `tidegate bench serve --help` for the load generator's options."""


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"rate must be positive or inf, got {text}")
    return value


def _token_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO:HI, got {text!r}") from None
    if not 0 <= lo < hi:
        raise argparse.ArgumentTypeError(f"need 0 <= LO < HI, got {text!r}")
    return lo, hi


def _goodput(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, ms = item.partition(":")
        if name not in ("ttft", "tpot") or not ms:
            raise argparse.ArgumentTypeError(f"--goodput takes ttft:MS and/or tpot:MS, got {item!r}")
        out[name] = float(ms)
    return out


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate bench serve",
                                description="Open-loop load generator (vLLM benchmark_serving "
                                            "definitions; see sims/metrics.py).")
    t = p.add_argument_group("target")
    t.add_argument("--backend", choices=("http", "zmq"), default="http",
                   help="http: /v1/completions with SSE; zmq: gateway.client.AsyncClient")
    t.add_argument("--url", default="http://127.0.0.1:8000", help="base URL of the HTTP server")
    t.add_argument("--endpoint", default="/v1/completions")
    t.add_argument("--zmq-url", default="tcp://127.0.0.1:5556", help="gateway --zmq-listen address")
    t.add_argument("--model", default=None, help="model name (default: first of GET /v1/models)")
    t.add_argument("--api-key", default=None)
    t.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    t.add_argument("--no-return-token-ids", action="store_true",
                   help="do not ask for token ids; count one token per chunk (vLLM's convention)")
    w = p.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, default=None, help="default 100 (trace: its length)")
    w.add_argument("--rate", "--request-rate", dest="rate", type=_rate, default=math.inf,
                   help="requests/s; inf sends all at once (default)")
    w.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of inter-arrivals: 1 = Poisson, <1 burstier (cv = 1/sqrt(K))")
    w.add_argument("--input-len", default="512", help="N | uniform:LO:HI | lognormal:MEDIAN:SIGMA[:MAX]")
    w.add_argument("--output-len", default="128", help="as --input-len; sent as max_tokens")
    w.add_argument("--shared-prefix-fraction", type=float, default=0.0)
    w.add_argument("--shared-prefix-len", type=int, default=0)
    w.add_argument("--num-prefix-groups", type=int, default=1)
    w.add_argument("--trace", default=None,
                   help="JSONL trace (arrival_time, prompt_tokens, output_tokens), as sims reads")
    w.add_argument("--token-id-range", type=_token_range, default=(0, 256),
                   help="prompt token ids are drawn from [LO, HI) (default 0:256)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--max-concurrency", type=int, default=None,
                   help="cap on requests in flight (with --rate inf: a closed loop)")
    w.add_argument("--temperature", type=float, default=0.0)
    e = p.add_argument_group("code workloads (speculative decoding, bench.serving.edit)")
    e.add_argument("--workload", choices=("random", "edit", "completion"), default="random",
                   help="random: token-id prompts (default); edit: a code file and an instruction, "
                        "with a prediction; completion: the first half of a code file")
    e.add_argument("--oracle", action="store_true",
                   help="dummy weights: a greedy baseline with speculation off, then the same "
                        "requests with its output (lines altered per --keep) as the prediction")
    e.add_argument("--keep", default="1,0.75,0.5",
                   help="fractions of the prediction's lines left unchanged, one run each")
    e.add_argument("--corpus", default=None, help="directory of code files (default: the "
                   "Python standard library); 'heldout': tiny-coder's held-out evaluation files")
    e.add_argument("--file-chars", type=int, default=3000, help="characters per file at most")
    e.add_argument("--trace-dir", default=None, help="write each run's requests (prompt, "
                   "output and prediction ids) there as <run>.jsonl, for python -m "
                   "sims.speculation --trace")
    e.add_argument("--speculation", default=None,
                   help="the requests' speculation field (every workload; with edit/completion "
                        "the measured runs'): off | auto | a number (max_draft_tokens); default: "
                        "absent (the server's policy)")
    a = p.add_argument_group("agent sessions (issue 30, bench.serving.agent_replay)")
    a.add_argument("--agent-trace", default=None, metavar="FILE",
                   help="replay an agent-session trace (sims.agent_trace; `tidegate sim agent "
                        "--write-trace` makes one) at its times: session headers, pins, reuse "
                        "captured, follow-up TTFT; the simulator replays the same file")
    a.add_argument("--agent-rate-factor", type=float, default=1.0,
                   help="sessions arrive this many times as often (times within a session kept)")
    a.add_argument("--no-session-keys", action="store_true",
                   help="send no session header: the gateway finds sessions from the prompts")
    o = p.add_argument_group("output")
    o.add_argument("--slo-ttft-ms", default=None, metavar="MS|CLASS=MS,...",
                   help="TTFT target for every class, or per class (fast=200,normal=1000,"
                        "slow=4000): goodput and SLO attainment per class")
    o.add_argument("--slo-tpot-ms", default=None, metavar="MS|CLASS=MS,...",
                   help="TPOT target, as --slo-ttft-ms")
    o.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS",
                   help="vLLM's spelling of the SLOs: ttft:MS tpot:MS")
    o.add_argument("--json", default=None, help="write the result here")
    o.add_argument("--detailed", action="store_true", help="add per-request rows to the JSON")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    return p


def _schedule(args):
    from sims.workload import LengthSpec, ScheduleConfig, make_schedule, trace_schedule
    if args.trace:
        return trace_schedule(args.trace, args.num_requests)
    return make_schedule(ScheduleConfig(
        num_requests=args.num_requests or 100, rate=args.rate, burstiness=args.burstiness,
        input_len=LengthSpec.parse(args.input_len), output_len=LengthSpec.parse(args.output_len),
        shared_prefix_fraction=args.shared_prefix_fraction,
        shared_prefix_len=args.shared_prefix_len, num_prefix_groups=args.num_prefix_groups,
        seed=args.seed))


def _detail_rows(records, t0: float) -> list[dict]:
    rows = []
    for r in records:
        row = {"index": r.index, "prompt_len": r.prompt_len, "max_tokens": r.max_tokens,
               "send_s": r.send_time - t0, "output_tokens": r.output_tokens, "error": r.error}
        if r.ok:
            row.update(ttft_s=r.first_token_time - r.send_time, e2el_s=r.finish_time - r.send_time,
                       num_chunks=len(r.chunk_times))
        elif r.error_detail:
            row["error_detail"] = r.error_detail
        if r.retry_after_s == r.retry_after_s:  # a 429's Retry-After (retry-after-ms), s
            row["retry_after_s"] = r.retry_after_s
        rows.append(row)
    return rows


def serve_main(argv: list[str]) -> int:
    from bench.serving import loadgen
    from bench.serving.report import format_table
    from sims.metrics import summarize
    from sims.workload import make_prompts

    p = serve_parser()
    args = p.parse_args(argv)
    if args.agent_trace:
        from bench.serving.agent_replay import main as agent_main
        return agent_main(args)
    if args.workload != "random":
        return _code_workload(p, args)
    try:
        slo = _goodput(args.goodput)
        from scheduler.slo import parse_targets
        parse_targets(args.slo_ttft_ms)  # a bad target is a usage error, before any request
        parse_targets(args.slo_tpot_ms)
        schedule = _schedule(args)
        prompts = make_prompts(schedule, args.seed, args.token_id_range)
    except (ValueError, OSError, argparse.ArgumentTypeError) as exc:
        p.error(str(exc))
    slo_ttft = args.slo_ttft_ms if args.slo_ttft_ms is not None else slo.get("ttft")
    slo_tpot = args.slo_tpot_ms if args.slo_tpot_ms is not None else slo.get("tpot")
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    if args.backend == "zmq":
        try:
            importlib.import_module("gateway.client")
        except ModuleNotFoundError as exc:
            print(f"tidegate bench serve --backend zmq: gateway.client unavailable ({exc})",
                  file=sys.stderr)
            return 3
        coro = loadgen.run_zmq(args.zmq_url, schedule.offset, prompts, schedule.output_len,
                               args.max_concurrency, progress, args.timeout,
                               temperature=args.temperature,
                               speculation=_speculation_field(args.speculation))
    else:
        target = loadgen.HttpTarget(args.url, args.endpoint, args.model, args.api_key, args.timeout,
                                    return_token_ids=not args.no_return_token_ids,
                                    temperature=args.temperature,
                                    speculation=_speculation_field(args.speculation))
        coro = loadgen.run_http(target, schedule.offset, prompts, schedule.output_len,
                                args.max_concurrency, progress)
    target_name = args.zmq_url if args.backend == "zmq" else args.url
    print(f"tidegate bench serve: {len(prompts)} requests to {target_name} "
          f"(rate {args.rate:g}/s, max concurrency {args.max_concurrency or 'none'})",
          file=sys.stderr)
    import aiohttp
    never_answered = (aiohttp.ClientError, OSError, RuntimeError, TimeoutError)
    if args.backend == "zmq":
        from gateway.client import TidegateError
        never_answered += (TidegateError,)
    try:
        records, t0, model = asyncio.run(coro)
    except never_answered as exc:  # e.g. GET /v1/models failed, or no BackendInfo over ZMQ
        print(f"tidegate bench serve: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return 1
    result = summarize(records, start_time=t0, slo_ttft_ms=slo_ttft, slo_tpot_ms=slo_tpot)
    print(format_table(result, args.max_concurrency))
    if args.json:
        config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()}
        config["rate"] = "inf" if math.isinf(args.rate) else args.rate
        out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "model": model,
               "backend": args.backend, "config": config, **result}
        if args.detailed:
            out["requests"] = _detail_rows(records, t0)
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    return 0 if result["completed"] else 1


def _speculation_field(value: str | None):
    """--speculation off | auto | N -> the requests' `speculation` field (None: absent)."""
    if value is None or value in ("off", "auto"):
        return value
    return {"max_draft_tokens": int(value)}


def _code_workload(p: argparse.ArgumentParser, args) -> int:
    """`--workload edit|completion` (bench.serving.edit): runs against --url, JSON to --json."""
    from bench.serving.edit import format_result, keep_list, run_workload

    if args.backend != "http":
        p.error("--workload edit|completion runs over HTTP (--backend http)")
    try:
        keeps = keep_list(args.keep)
        output_len = int(args.output_len)
    except ValueError as exc:
        p.error(str(exc))
    spec = _speculation_field(args.speculation)
    out = asyncio.run(run_workload(
        url=args.url, endpoint=args.endpoint, model=args.model, workload=args.workload,
        oracle=args.oracle, keeps=keeps, num_requests=args.num_requests or 16,
        max_tokens=output_len, concurrency=args.max_concurrency or 1, seed=args.seed,
        corpus=args.corpus, file_chars=args.file_chars, speculation=spec,
        temperature=args.temperature, timeout_s=args.timeout, trace_dir=args.trace_dir))
    print(format_result(out))
    if args.json:
        out["date"] = datetime.datetime.now().isoformat(timespec="seconds")
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    return 0 if all(r["completed"] == r["num_requests"] for r in out["runs"].values()) else 1


def engine_main(argv: list[str]) -> int:
    try:
        module = importlib.import_module("bench.engine.steps")
    except ModuleNotFoundError as exc:
        if exc.name in ("backend", "bench.engine.steps"):
            print("tidegate bench engine: the engine benchmark (bench/engine/steps.py) is not built yet; "
                  "nothing to run", file=sys.stderr)
            return 3
        raise
    return int(module.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] == "serve":
        return serve_main(argv[1:])
    if argv[0] == "engine":
        return engine_main(argv[1:])
    if argv[0] == "overhead":
        from bench.serving.overhead import main as overhead_main
        return overhead_main(argv[1:])
    print(f"tidegate bench: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
