"""Turn a `SimResult` into the report: JSON-ready dict and a readable table."""
from __future__ import annotations

import numpy as np

from scheduler.classes import QueueClass
from scheduler.slo import SLOTargets
from sims.event_loop import SimResult
from sims.metrics import request_metrics, stats_ms, weighted_stats_ms

LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def summarize(r: SimResult, *, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None, slo: SLOTargets | None = None) -> dict:
    """`slo_ttft_ms` / `slo_tpot_ms`: one target for every request (goodput); `slo`: targets per
    class (scheduler.slo), which decide goodput instead when given, and each class's attainment."""
    w = r.workload
    done = np.isfinite(r.finish_time)
    arrival = w.arrival_time[done]
    ttft, tpot, e2el, good, multi = request_metrics(
        arrival, r.first_token_time[done], r.finish_time[done], r.num_output[done],
        slo_ttft_s=None if slo_ttft_ms is None else slo_ttft_ms / 1e3,
        slo_tpot_s=None if slo_tpot_ms is None else slo_tpot_ms / 1e3)
    classes = r.queue_class[done]
    if slo is not None and slo.any:
        good = _met_by_class(slo, classes, ttft, tpot, multi)
    wait = r.dispatch_time[done] - arrival
    start = float(w.arrival_time[0]) if len(w) else 0.0
    duration = max(float(r.finish_time[done].max()) - start, 1e-12) if done.any() else 0.0
    n_done = int(done.sum())
    out_tokens = int(r.num_output[done].sum())
    rate = (lambda x: x / duration) if duration else (lambda x: 0.0)
    by_class = {}
    refused_by = r.extra.get("retry_after_s", {})
    all_classes = r.queue_class
    for cls in QueueClass:
        m = classes == cls
        if not m.any():
            continue
        by_class[cls.name.lower()] = {
            "completed": int(m.sum()), "ttft_ms": stats_ms(ttft[m]),
            "tpot_ms": stats_ms(tpot[m & multi]), "e2el_ms": stats_ms(e2el[m]),
            "queue_wait_ms": stats_ms(wait[m]), "goodput_fraction": float(good[m].mean()),
            "refused": sum(1 for i in refused_by if all_classes[i] == cls)}
    bs = r.batch_sizes
    sd, sp, st = r.step_decode, r.step_prefill, r.step_time
    num_steps = len(st)
    busy = float(st.sum())
    kinds = {"decode_only": (sd > 0) & (sp == 0), "prefill_only": (sd == 0) & (sp > 0),
             "mixed": (sd > 0) & (sp > 0)}
    stats = r.backend_stats
    q_tok = sum(s["num_prefix_query_tokens"] for s in stats)
    hit_tok = sum(s["num_prefix_hit_tokens"] for s in stats)
    series = r.series
    return {
        "completed": n_done,
        "rejected": int(r.rejected.sum()),
        "duration_s": duration,
        "request_throughput": rate(n_done),
        "output_throughput": rate(out_tokens),
        "total_token_throughput": rate(out_tokens + int(w.prompt_len[done].sum())),
        "ttft_ms": stats_ms(ttft),
        "tpot_ms": stats_ms(tpot[multi]),
        "itl_ms": weighted_stats_ms(r.itl_values, r.itl_weights),
        "e2el_ms": stats_ms(e2el),
        "queue_wait_ms": stats_ms(wait),
        "goodput": rate(int(good.sum())),
        "goodput_fraction": float(good.mean()) if n_done else 0.0,
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms},
        "by_class": by_class,
        "admission": {"refused": len(refused_by),
                      "retry_after_ms": stats_ms(np.array(list(refused_by.values()), dtype=float))
                      if refused_by else None,
                      "slo": slo.describe() if slo is not None and slo.any else None},
        "batch_size": {"num_batches": len(bs), "mean": float(bs.mean()) if len(bs) else 0.0,
                       "p50": float(np.percentile(bs, 50)) if len(bs) else 0.0,
                       "p99": float(np.percentile(bs, 99)) if len(bs) else 0.0,
                       "max": int(bs.max()) if len(bs) else 0,
                       "histogram": _histogram(bs)},
        "steps": {"num_steps": num_steps,
                  "mean_decode_seqs": float(sd.mean()) if num_steps else 0.0,
                  "mean_prefill_tokens": float(sp.mean()) if num_steps else 0.0,
                  "mean_step_ms": busy / num_steps * 1e3 if num_steps else 0.0,
                  **{f"frac_{k}": float(v.mean()) if num_steps else 0.0 for k, v in kinds.items()},
                  "decode_batch_histogram": _histogram(sd[sd > 0]),
                  "backend_busy_fraction": busy / (duration * len(stats)) if duration else 0.0},
        "kv": {"num_blocks_per_backend": r.extra.get("num_kv_blocks"),
               "mean_usage": float(series["kv_usage"].mean()) if len(series["kv_usage"]) else 0.0,
               "max_usage": float(series["kv_usage"].max()) if len(series["kv_usage"]) else 0.0,
               "internal_fragmentation": float(series["fragmentation"].mean())
               if len(series["fragmentation"]) else 0.0,
               "prefix_hit_rate": hit_tok / q_tok if q_tok else 0.0},
        "preemptions": sum(s["num_preemptions"] for s in stats),
        "host_tier": _host_tier(stats),
        "placement": _placement(r, stats),
        "sim": {"events": r.events, "wall_s": r.wall_s, "events_per_s": r.events / r.wall_s,
                "requests_per_wall_s": len(w) / r.wall_s, "simulated_s": r.sim_end},
    }


def _met_by_class(slo: SLOTargets, classes: np.ndarray, ttft: np.ndarray, tpot: np.ndarray,
                  multi: np.ndarray) -> np.ndarray:
    """Per request: met its class's TTFT and TPOT targets (scheduler.slo.SLOTargets.met)."""
    inf = np.inf
    ttft_lim = np.array([inf if t is None else t / 1e3 for t in slo.ttft_ms])[classes]
    tpot_lim = np.array([inf if t is None else t / 1e3 for t in slo.tpot_ms])[classes]
    return (ttft <= ttft_lim) & (~multi | (tpot <= tpot_lim))


def _host_tier(stats: list[dict]) -> dict:
    """The host KV tier over all backends ({} without one). `peak_gib_per_backend` is the host
    memory the workload used at its peak: with a tier large enough never to drop a block, the
    host memory this workload needs."""
    if not stats or "host_kv_blocks" not in stats[0]:
        return {}
    hit = sum(s["num_prefix_hit_tokens"] for s in stats)
    return {"peak_gib_per_backend": max(s["host_kv_peak_gib"] for s in stats),
            "swap_preemptions": sum(s["num_swap_preemptions"] for s in stats),
            "host_hit_tokens": sum(s["num_host_hit_tokens"] for s in stats),
            "host_share_of_hits": sum(s["num_host_hit_tokens"] for s in stats) / hit if hit else 0.0,
            "saved_blocks": sum(s["host_saved_blocks"] for s in stats),
            "loaded_blocks": sum(s["host_loaded_blocks"] for s in stats),
            "dropped_blocks": sum(s["host_dropped_blocks"] for s in stats)}


def _placement(r, stats: list[dict]) -> dict:
    """Per-backend load under the placement policy: busy time, requests, prefix hit rates, and
    the busiest/idlest ratio of busy time (the hot-spot figure)."""
    p = dict(r.extra.get("placement", {}))
    busy = p.get("backend_busy_s", [])
    if busy:
        p["busy_max_over_min"] = max(busy) / min(busy) if min(busy) > 0 else float("inf")
    p["backend_prefix_hit_rate"] = [s["num_prefix_hit_tokens"] / s["num_prefix_query_tokens"]
                                    if s["num_prefix_query_tokens"] else 0.0 for s in stats]
    return p


def _histogram(values: np.ndarray) -> dict[str, int]:
    """Counts in power-of-two buckets: {"1": n, "2-3": n, "4-7": n, ...}."""
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return {}
    hist: dict[str, int] = {}
    edges = 1 << np.arange(0, int(values.max()).bit_length() + 1)
    counts, _ = np.histogram(values, bins=np.append(edges, edges[-1] * 2))
    for lo, c in zip(edges, counts):
        if c:
            hi = lo * 2 - 1
            hist[str(lo) if hi == lo else f"{lo}-{hi}"] = int(c)
    return hist


def format_table(rep: dict) -> str:
    lines = [f"{'completed':<26}{rep['completed']:>12}   rejected {rep['rejected']}",
             f"{'duration (s)':<26}{rep['duration_s']:>12.2f}",
             f"{'request throughput (/s)':<26}{rep['request_throughput']:>12.2f}",
             f"{'output throughput (tok/s)':<26}{rep['output_throughput']:>12.1f}",
             (f"{'goodput (req/s)':<26}{rep['goodput']:>12.2f}   ({100 * rep['goodput_fraction']:.1f}% "
             f"of requests met the SLO)"), "",
             f"{'latency (ms)':<16}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}"]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                       ("e2el_ms", "E2E"), ("queue_wait_ms", "gateway wait")):
        s = rep[key]
        lines.append(f"{label:<16}{s['mean']:>10.2f}{s['p50']:>10.2f}{s['p90']:>10.2f}{s['p99']:>10.2f}")
    if len(rep["by_class"]) > 1:
        lines += ["", (f"{'by class':<10}{'n':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}"
                  f"{'wait p99':>10}")]
        for name, c in rep["by_class"].items():
            lines.append(f"{name:<10}{c['completed']:>9}{c['ttft_ms']['p50']:>10.2f}"
                         f"{c['ttft_ms']['p99']:>10.2f}{c['tpot_ms']['p50']:>10.2f}"
                         f"{c['queue_wait_ms']['p99']:>10.2f}")
    adm = rep.get("admission") or {}
    if adm.get("slo"):
        by = ", ".join(f"{name} {c.get('refused', 0)} refused, "
                       f"{100 * c['goodput_fraction']:.1f}% of completed in SLO"
                       for name, c in rep["by_class"].items())
        ra = adm.get("retry_after_ms")
        lines += ["", f"admission: {adm['refused']} refused" + (
            f" (Retry-After p50 {ra['p50']:.0f} ms)" if ra else "") + f"; {by}"]
    b, st, kv = rep["batch_size"], rep["steps"], rep["kv"]
    lines += ["",
              (f"gateway batches {b['num_batches']}, size mean {b['mean']:.1f} p99 {b['p99']:.0f} "
              f"max {b['max']}"),
              (f"steps {st['num_steps']}: decode-only {100 * st['frac_decode_only']:.0f}%, "
              f"mixed {100 * st['frac_mixed']:.0f}%, prefill-only {100 * st['frac_prefill_only']:.0f}%; "
              f"mean {st['mean_decode_seqs']:.1f} decodes + {st['mean_prefill_tokens']:.0f} prefill "
              f"tokens, {st['mean_step_ms']:.2f} ms; backends busy {100 * st['backend_busy_fraction']:.0f}%"),
              (f"KV: {kv['num_blocks_per_backend']} blocks/backend, use mean {100 * kv['mean_usage']:.1f}% "
              f"max {100 * kv['max_usage']:.1f}%, fragmentation {100 * kv['internal_fragmentation']:.1f}%, "
              f"prefix hit rate {100 * kv['prefix_hit_rate']:.1f}%, preemptions {rep['preemptions']}"),
              *([] if not rep.get("host_tier") else [
                  (f"host tier: peak {rep['host_tier']['peak_gib_per_backend']:.2f} GiB/backend, "
                   f"{100 * rep['host_tier']['host_share_of_hits']:.1f}% of hit tokens from host, "
                   f"{rep['host_tier']['swap_preemptions']} swapped preemptions, "
                   f"{rep['host_tier']['dropped_blocks']} blocks dropped")]),
              (f"simulator: {rep['sim']['events']} events in {rep['sim']['wall_s']:.2f} s "
              f"({rep['sim']['events_per_s']:.0f} events/s, "
              f"{rep['sim']['requests_per_wall_s']:.0f} requests/s)")]
    return "\n".join(lines)
