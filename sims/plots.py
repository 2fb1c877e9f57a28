"""matplotlib (Agg) plots, each written as PNG and SVG: DIR/<name>.png and DIR/<name>.svg."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from scheduler.classes import QueueClass


def _save(fig, outdir: str | Path, name: str) -> list[str]:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        p = outdir / f"{name}.{ext}"
        fig.savefig(p, dpi=120, bbox_inches="tight")
        paths.append(str(p))
    plt.close(fig)
    return paths


def latency_throughput(points: list[dict], outdir, fit: dict | None = None,
                       name: str = "latency_throughput", stat: str = "p50") -> list[str]:
    L = np.array([p["ttft_ms"][stat] for p in points])
    T = np.array([p["output_throughput"] for p in points])
    front = np.array([p.get("pareto", False) for p in points])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(L[~front], T[~front], s=18, color="0.6", label="configurations")
    order = np.argsort(L[front])
    ax.plot(L[front][order], T[front][order], "o-", color="C0", label="Pareto frontier")
    if fit is not None:
        from sims.fit import predict_spec
        grid = np.geomspace(L.min(), L.max(), 200)
        ax.plot(grid, predict_spec(grid, fit["alpha"], fit["beta"], fit["block_size"],
                                   fit["bandwidth_gbps"]), "--", color="C3",
                label=f"spec fit α={fit['alpha']:.3g} β={fit['beta']:.3g} (R²={fit['r2']:.2f})")
        for alt in fit.get("alternatives", []):
            p = alt["params"]
            if "t_max" in p and np.isfinite(p["t_max"]) and np.isfinite(p["l_half_ms"]):
                ax.plot(grid, p["t_max"] * grid / (grid + p["l_half_ms"]), ":", color="C2",
                        label=f"T = Tmax·L/(L+L½): Tmax={p['t_max']:.3g} L½={p['l_half_ms']:.3g} ms "
                              f"(R²={alt['r2_log']:.2f})")
    ax.set_xscale("log")
    ax.set_xlabel(f"TTFT {stat} (ms)")
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_title("latency–throughput")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, outdir, name)


def fit_plot(fit: dict, outdir, name: str = "fit") -> list[str]:
    from sims.fit import predict_spec
    L, T = np.array(fit["latency_ms"]), np.array(fit["throughput_tok_s"])
    fig, (ax, rx) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1]})
    ax.scatter(L, T, s=18, color="C0", label="points")
    grid = np.geomspace(L.min(), L.max(), 200)
    ax.plot(grid, predict_spec(grid, fit["alpha"], fit["beta"], fit["block_size"], fit["bandwidth_gbps"]),
            color="C3", label=f"spec form α={fit['alpha']:.3g} β={fit['beta']:.3g}")
    for alt in fit.get("alternatives", []):
        p = alt["params"]
        if "a" in p:
            ax.plot(grid, p["a"] * grid ** p["b"], ":", label=alt["form"])
        elif "t_max" in p and np.isfinite(p["t_max"]) and np.isfinite(p["l_half_ms"]):
            ax.plot(grid, p["t_max"] * grid / (grid + p["l_half_ms"]), ":", label=alt["form"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("throughput (tokens/s)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    rx.axhline(0, color="0.5")
    rx.scatter(L, fit["residuals_log"], s=12, color="C3")
    rx.set_ylabel("log residual")
    rx.set_xlabel("latency (ms)")
    return _save(fig, outdir, name)


def latency_cdfs(result, outdir, name: str = "latency_cdf") -> list[str]:
    w = result.workload
    done = np.isfinite(result.finish_time)
    ttft = (result.first_token_time - w.arrival_time)[done] * 1e3
    e2el = (result.finish_time - w.arrival_time)[done] * 1e3
    cls = result.queue_class[done]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, values, label in ((axes[0], ttft, "TTFT (ms)"), (axes[1], e2el, "end-to-end (ms)")):
        for c in QueueClass:
            v = np.sort(values[cls == c])
            if v.size:
                ax.plot(v, np.arange(1, v.size + 1) / v.size, label=f"{c.name.lower()} (n={v.size})")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return _save(fig, outdir, name)


def timeseries(result, outdir, name: str = "queue_kv") -> list[str]:
    s = result.series
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(s["t"], s["queue_depth"], color="C0", lw=1, label="waiting requests (gateway + backends)")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("waiting requests", color="C0")
    ax2 = ax.twinx()
    ax2.plot(s["t"], 100 * np.asarray(s["kv_usage"]), color="C1", lw=1, label="KV use")
    ax2.set_ylabel("KV blocks in use (%)", color="C1")
    ax2.set_ylim(0, 100)
    ax.set_title("queue depth and KV use")
    return _save(fig, outdir, name)


def placement_latency(points: list[dict], outdir, name: str = "placement",
                      title: str = "") -> list[str]:
    """TTFT p50/p99, TPOT p50 and the goodput fraction against the arrival rate, one line per
    placement policy (points from `sims.placement_study`)."""
    policies = list(dict.fromkeys(p["policy"] for p in points))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for k, pol in enumerate(policies):
        pts = sorted((p for p in points if p["policy"] == pol), key=lambda p: p["rate"])
        r = [p["rate"] for p in pts]
        color = f"C{k}"
        axes[0].plot(r, [p["ttft_ms"]["p50"] for p in pts], "o-", color=color, label=f"{pol} p50")
        axes[0].plot(r, [p["ttft_ms"]["p99"] for p in pts], "x--", color=color, label=f"{pol} p99")
        axes[1].plot(r, [p["tpot_ms"]["p50"] for p in pts], "o-", color=color, label=pol)
        axes[2].plot(r, [p["goodput_fraction"] for p in pts], "o-", color=color, label=pol)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("TTFT (ms)")
    axes[1].set_ylabel("TPOT p50 (ms)")
    axes[2].set_ylabel("fraction meeting TTFT<=500 ms, TPOT<=50 ms")
    axes[2].axhline(0.9, color="0.5", lw=0.8, ls=":")
    for ax in axes:
        ax.set_xlabel("arrival rate (requests/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, outdir, name)
