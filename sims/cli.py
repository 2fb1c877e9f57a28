"""`tidegate sim`: run, sweep, fit, search, plan (and validate, which `tidegate` runs from bench/).

    tidegate sim run --model deepseek-coder-6.7b --gpu h200 --backends 4 --rate 200 \\
        --num-requests 20000 --slo-ttft-ms 200 --slo-tpot-ms 50 --json out.json --plot plots/
    tidegate sim sweep --rates geom:20:800:8 --backends 4 --json sweep.json --csv sweep.csv --plot plots/
    tidegate sim fit sweep.csv --block-size 16 --bandwidth-gbps 4280 --json
    tidegate sim search --rate 300 --slo-ttft-ms 300 --slo-tpot-ms 40 --backends-grid 2,4,8
    tidegate sim plan --model deepseek-coder-33b --gpu h200 --gpus 1-8
    tidegate sim slo --trace trace.jsonl --slo-ttft-ms fast=200,normal=1000,slow=4000
    tidegate sim retry-bound --step-ms 20 --backends 4 --slot-model --slo-ttft-ms ... --forks 20
    tidegate sim agent --profile P.json --backends 4 --sessions 64 --loads 0.5,0.9
    tidegate sim window --profile P.json --workloads 40:32:16,80:32:16 --message-cost-us 350,250
    tidegate sim validate --profile out/validate_profile.json --seeds 0,1,2 --json validate.json
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from sims.options import add_run_args, parse_list, parse_with_config, spec_from_args


def _write_json(obj, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2, default=_default)
        fh.write("\n")


def _default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# ---- run -----------------------------------------------------------------------------------------
def cmd_run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidegate sim run", description="simulate one configuration")
    add_run_args(p)
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")
    a = parse_with_config(p, argv)
    spec = spec_from_args(a)
    spec = replace(spec, engine=replace(spec.engine, progress=a.progress))
    from sims.report import format_table, summarize
    from sims.runner import simulate_spec
    result = simulate_spec(spec)
    rep = summarize(result, slo_ttft_ms=spec.slo_ttft_ms, slo_tpot_ms=spec.slo_tpot_ms,
                    slo=spec.scheduler.slo)
    rep["config"] = spec.describe()
    cost = spec.cost.build()
    rep["cost_model"] = getattr(cost, "describe", dict)()
    print(format_table(rep))
    if a.json_out:
        _write_json(rep, a.json_out)
    if a.plot:
        from sims import plots
        files = plots.latency_cdfs(result, a.plot) + plots.timeseries(result, a.plot)
        print(f"plots: {', '.join(files)}")
    return 0


# ---- sweep ---------------------------------------------------------------------------------------
def cmd_sweep(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidegate sim sweep",
                                description="sweep arrival rate (and batcher settings); Pareto frontier")
    add_run_args(p, num_requests=2000)
    p.add_argument("--rates", default="geom:5:200:8", help="'1,2,4' or geom:LO:HI:N or lin:LO:HI:N")
    p.add_argument("--min-latency-ms-grid", help="batcher min_latency_ms values, e.g. 0,2,5")
    p.add_argument("--max-batch-size-grid", help="batcher max_batch_size values, e.g. 32,128")
    p.add_argument("--idle-flush-grid", help="on,off")
    p.add_argument("--jobs", type=int, help="processes (default: all cores)")
    p.add_argument("--csv", help="write latency_ms,throughput_tok_s,... (what `sim fit` reads)")
    p.add_argument("--latency-stat", default="p50", help="TTFT statistic used as latency L")
    p.add_argument("--bandwidth-gbps", type=float, help="C for the fitted model (default: the GPU's)")
    a = parse_with_config(p, argv)
    base = spec_from_args(a)
    specs = []
    for rate in parse_list(a.rates):
        for ml in parse_list(a.min_latency_ms_grid) or [a.min_latency_ms]:
            for mb in parse_list(a.max_batch_size_grid, int) or [a.max_batch_size]:
                for idle in parse_list(a.idle_flush_grid, bool) or [a.idle_flush]:
                    s = replace(base, workload=replace(base.workload, rate=rate))
                    specs.append(s.with_batcher(min_latency_ms=ml, max_batch_size=mb, idle_flush=idle))
    from sims.sweep import run_many, sweep_points, write_csv
    reports = run_many(specs, a.jobs)
    points = sweep_points(reports, stat=a.latency_stat)
    fit = _fit_points(points, a)
    print(f"{'rate':>8}{'backends':>9}{'win ms':>7}{'maxb':>5}{'idle':>5}{'req/s':>9}{'tok/s':>10}"
          f"{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}  pareto")
    for pt in points:
        print(f"{pt['rate']:>8.2f}{pt['backends']:>9}{pt['min_latency_ms']:>7g}{pt['max_batch_size']:>5}"
              f"{'on' if pt['idle_flush'] else 'off':>5}{pt['request_throughput']:>9.2f}"
              f"{pt['output_throughput']:>10.1f}{pt['ttft_ms']['p50']:>10.2f}{pt['ttft_ms']['p99']:>10.2f}"
              f"{pt['tpot_ms']['p50']:>10.2f}  {'*' if pt['pareto'] else ''}")
    if fit is not None:
        print(f"fit T = α·(1/L)^β·min(B, C/L): α={fit['alpha']:.4g} β={fit['beta']:.4g} "
              f"R²={fit['r2']:.3f} — {fit['verdict']}")
    if a.json_out:
        _write_json({"points": points, "fit": fit, "latency_stat": a.latency_stat}, a.json_out)
    if a.csv:
        write_csv(points, a.csv, a.latency_stat)
    if a.plot:
        from sims import plots
        print("plots: " + ", ".join(plots.latency_throughput(points, a.plot, fit, stat=a.latency_stat)))
    return 0


def _fit_points(points: list[dict], a) -> dict | None:
    from sims.fit import fit_all
    from sims.hardware import get_gpu
    L = [pt["ttft_ms"][a.latency_stat] for pt in points]
    T = [pt["output_throughput"] for pt in points]
    try:
        bw = a.bandwidth_gbps or get_gpu(a.gpu).bandwidth / 1e9
        return fit_all(L, T, a.block_size, bw)
    except ValueError:
        return None


# ---- fit -----------------------------------------------------------------------------------------
def cmd_fit(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidegate sim fit",
                                description="fit T = α·(1/L)^β·min(B, C/L) to (latency, throughput) points")
    p.add_argument("points", help="CSV latency_ms,throughput_tok_s or the JSON `sim sweep` writes")
    p.add_argument("--block-size", type=float, required=True, help="B")
    p.add_argument("--bandwidth-gbps", type=float, required=True, help="C, GB/s")
    p.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="print the result as JSON (or write it to OUT)")
    p.add_argument("--latency-stat", default="p50", help="for sweep JSON: which TTFT statistic")
    p.add_argument("--plot", metavar="DIR")
    a = p.parse_args(argv)
    from sims.fit import fit_all, load_points
    try:
        L, T = load_points(a.points, stat=a.latency_stat)
        fit = fit_all(L, T, a.block_size, a.bandwidth_gbps)
    except (ValueError, KeyError, OSError) as exc:
        print(f"tidegate sim fit: {exc}", file=sys.stderr)
        return 2
    if a.json == "-":
        print(json.dumps(fit, indent=2, default=_default))
    else:
        lo_a, hi_a = fit["alpha_ci"]
        lo_b, hi_b = fit["beta_ci"]
        print(f"T = α·(1/L)^β·min(B, C/L) over {fit['num_points']} points (B={a.block_size:g}, "
              f"C={a.bandwidth_gbps:g} GB/s)")
        print(f"  α = {fit['alpha']:.4g}   95% CI [{lo_a:.4g}, {hi_a:.4g}]")
        print(f"  β = {fit['beta']:.4g}   95% CI [{lo_b:.4g}, {hi_b:.4g}]")
        print(f"  R² = {fit['r2']:.4f} (log space), {fit['r2_linear']:.4f} (linear); "
              f"RMS log residual {fit['rmse_log']:.3f}")
        print(f"{'latency ms':>12}{'throughput':>14}{'log resid':>11}")
        for L_, T_, r in zip(fit["latency_ms"], fit["throughput_tok_s"], fit["residuals_log"]):
            print(f"{L_:>12.3f}{T_:>14.1f}{r:>11.3f}")
        print("alternatives fitted to the same points:")
        for alt in fit["alternatives"]:
            params = ", ".join(f"{k}={v:.4g}" for k, v in alt["params"].items())
            print(f"  {alt['form']:<36} {params}  R²={alt['r2_log']:.4f} AIC={alt['aic']:.1f}")
        print(f"verdict: {fit['verdict']}")
        if a.json:
            _write_json(fit, a.json)
    if a.plot:
        from sims import plots
        print("plots: " + ", ".join(plots.fit_plot(fit, a.plot)), file=sys.stderr)
    return 0


# ---- search --------------------------------------------------------------------------------------
def cmd_search(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidegate sim search",
                                description="batcher settings and backend count maximizing goodput "
                                            "per GPU under a P99 SLO")
    add_run_args(p, num_requests=2000)
    p.add_argument("--backends-grid", default="1,2,4", help="backend counts to try")
    p.add_argument("--max-batch-size-grid", default="32,128")
    p.add_argument("--min-latency-ms-grid", default="0,1,5", help="0 = no window")
    p.add_argument("--target-throughput-grid", default="8000")
    p.add_argument("--idle-flush-grid", default="on,off")
    p.add_argument("--jobs", type=int)
    p.add_argument("--top", type=int, default=10, help="rows to print")
    a = parse_with_config(p, argv)
    if a.slo_ttft_ms is None and a.slo_tpot_ms is None:
        p.error("give an SLO: --slo-ttft-ms and/or --slo-tpot-ms (P99)")
    spec0 = spec_from_args(a)
    if (a.slo_ttft_ms and spec0.slo_ttft_ms is None) or (a.slo_tpot_ms and spec0.slo_tpot_ms is None):
        p.error("search ranks by one P99 target for every request: give --slo-ttft-ms MS "
                "(per-class targets: `tidegate sim slo`)")
    from sims.search import build_grid, search
    specs = build_grid(spec_from_args(a), parse_list(a.backends_grid, int),
                       parse_list(a.max_batch_size_grid, int), parse_list(a.min_latency_ms_grid),
                       parse_list(a.target_throughput_grid), parse_list(a.idle_flush_grid, bool))
    out = search(specs, a.jobs)
    print(f"{'backends':>8}{'win ms':>7}{'maxb':>5}{'target':>7}{'idle':>5}{'SLO':>5}"
          f"{'goodput/GPU':>12}{'TTFT p99':>10}{'TPOT p99':>10}{'batch':>7}")
    for r in out["candidates"][:a.top]:
        print(f"{r['backends']:>8}{r['min_latency_ms']:>7g}{r['max_batch_size']:>5}"
              f"{r['target_throughput']:>7g}{'on' if r['idle_flush'] else 'off':>5}"
              f"{'ok' if r['meets_p99_slo'] else 'miss':>5}{r['goodput_per_gpu']:>12.2f}"
              f"{r['ttft_p99_ms']:>10.2f}{r['tpot_p99_ms']:>10.2f}{r['mean_batch_size']:>7.1f}")
    b = out["best"]
    if not out["feasible"]:
        print("no configuration meets the P99 SLO at this load; the best shown misses it")
    print(f"best: {b['backends']} backend(s), window {b['min_latency_ms']:g} ms, max batch "
          f"{b['max_batch_size']}, idle flush {'on' if b['idle_flush'] else 'off'}: "
          f"{b['goodput_per_gpu']:.2f} good req/s per GPU")
    c = out["window_vs_no_window"]
    if c:
        print(f"window vs none (best windowed at {c['best_window']['backends']} backends): goodput/GPU "
              f"{c['goodput_per_gpu_gain']:+.2f} req/s, TTFT p99 {c['ttft_p99_cost_ms']:+.2f} ms, TPOT p99 "
              f"{c['tpot_p99_change_ms']:+.2f} ms, batches/s {-c['batches_per_s_saved']:+.1f} "
              f"(mean batch {c['mean_batch_size'][0]:.1f} vs {c['mean_batch_size'][1]:.1f})")
    if a.json_out:
        _write_json(out, a.json_out)
    return 0


# ---- plan ----------------------------------------------------------------------------------------
def cmd_plan(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidegate sim plan",
                                description="pipeline × tensor parallel plans for a model on N GPUs")
    p.add_argument("--model", default="deepseek-coder-33b")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--gpus", default="1-8", help="N, or a range LO-HI")
    p.add_argument("--batch", type=int, default=64, help="concurrent sequences per replica")
    p.add_argument("--context-len", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--weight-dtype", default="bf16")
    p.add_argument("--kv-dtype", default="bf16")
    p.add_argument("--interconnect", default="nvlink", help="between pipeline stages: nvlink | pcie")
    p.add_argument("--all", action="store_true", help="print every plan, not only the best")
    p.add_argument("--json", dest="json_out", metavar="OUT")
    a = p.parse_args(argv)
    from sims.hardware import get_gpu
    from sims.model_shape import load_model_shape
    from sims.plan import PlanConfig, best_plans, enumerate_plans
    lo, _, hi = a.gpus.partition("-")
    counts = range(int(lo), int(hi or lo) + 1)
    shape, gpu = load_model_shape(a.model), get_gpu(a.gpu)
    cfg = PlanConfig(batch=a.batch, context_len=a.context_len, prompt_len=a.prompt_len,
                     weight_dtype=a.weight_dtype, kv_dtype=a.kv_dtype, interconnect=a.interconnect)
    out = []
    print(f"{shape.name} on {gpu.name}: batch {a.batch}/replica, context {a.context_len}, "
          f"weights {a.weight_dtype}, KV {a.kv_dtype}, stages over {a.interconnect}")
    print(f"{'GPUs':>4} {'goal':<10}{'tp':>3}{'pp':>3}{'dp':>3}  {'stage layers':<22}{'mem GB':>7}"
          f"{'TPOT ms':>9}{'TTFT ms':>9}{'tok/s':>10}{'max batch':>10}")
    for n in counts:
        plans = enumerate_plans(shape, gpu, n, cfg)
        best = best_plans(plans)
        out.append({"num_gpus": n, "best_throughput": best["throughput"] and best["throughput"].to_dict(),
                    "best_latency": best["latency"] and best["latency"].to_dict(),
                    "plans": [pl.to_dict() for pl in plans]})
        bt, bl = best["throughput"], best["latency"]
        shown = plans if a.all else [x for x in (bt, None if bl is bt else bl) if x]
        if not shown:
            print(f"{n:>4} no plan fits ({plans[0].reason})")
        for i, pl in enumerate(shown):
            goal = ("both" if pl is best["throughput"] is best["latency"] else "throughput"
                    if pl is best["throughput"] else "latency") if not a.all else (
                "fits" if pl.fits else "NO FIT")
            split = ",".join(map(str, pl.stage_layers))
            print(f"{n:>4} {goal:<10}{pl.tp:>3}{pl.pp:>3}{pl.dp:>3}  {split[:21]:<22}"
                  f"{pl.mem_per_gpu_gb:>7.1f}{pl.tpot_ms:>9.2f}{pl.ttft_ms:>9.2f}"
                  f"{pl.throughput_tok_s:>10.0f}{pl.max_tokens_kv // a.context_len:>10}")
    if a.json_out:
        _write_json({"model": shape.name, "gpu": gpu.name, "config": vars(a), "results": out}, a.json_out)
    return 0


def cmd_window(argv: list[str]) -> int:
    from sims.window_search import main as window_main
    return window_main(argv)


def cmd_slo(argv: list[str]) -> int:
    from sims.slo_plan import main as slo_main
    return slo_main(argv)


def cmd_retry_bound(argv: list[str]) -> int:
    from sims.retry_after_bound import main as bound_main
    return bound_main(argv)


def cmd_agent(argv: list[str]) -> int:
    from sims.agent_sim import main as agent_main
    return agent_main(argv)


COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "fit": cmd_fit, "search": cmd_search, "plan": cmd_plan,
            "window": cmd_window, "slo": cmd_slo, "agent": cmd_agent,
            "retry-bound": cmd_retry_bound}
# `tidegate sim validate` (the simulator against the live service) is bench.simulator.validate: it needs
# the gateway, which sims/ may not import; the `tidegate` command routes it there.


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\ncommands: " + ", ".join([*COMMANDS, "validate"]) + "   (`tidegate sim CMD --help` for options)")
        return 0
    cmd = COMMANDS.get(argv[0])
    if argv[0] == "validate":  # reached only through `python -m sims`
        print("tidegate sim validate: run it as `tidegate sim validate` (bench.simulator.validate)", file=sys.stderr)
        return 2
    if cmd is None:
        print(f"tidegate sim: unknown command {argv[0]!r}; one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return cmd(argv[1:])
    except (ValueError, OSError) as exc:
        print(f"tidegate sim {argv[0]}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
