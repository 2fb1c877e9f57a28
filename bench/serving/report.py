"""The human-readable result table, laid out like vLLM's benchmark_serving."""
from __future__ import annotations

_SECTIONS = (("ttft_ms", "Time to First Token", "TTFT"),
             ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
             ("itl_ms", "Inter-token Latency", "ITL"),
             ("e2el_ms", "End-to-end Latency", "E2EL"))


def _row(label: str, value) -> str:
    if isinstance(value, float):
        value = f"{value:.2f}"
    return f"{label:<40} {value:<10}"


def format_table(s: dict, max_concurrency: int | None = None) -> str:
    lines = [f"{' Serving Benchmark Result ':=^50}",
             _row("Successful requests:", s["completed"]),
             _row("Failed requests:", s["num_errors"])]
    if s["errors"]:
        lines.append(_row("  by kind:", ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items()))))
    if max_concurrency:
        lines.append(_row("Maximum request concurrency:", max_concurrency))
    lines += [_row("Benchmark duration (s):", s["duration_s"]),
              _row("Total input tokens:", s["total_input_tokens"]),
              _row("Total generated tokens:", s["total_output_tokens"]),
              _row("Request throughput (req/s):", s["request_throughput"]),
              _row("Output token throughput (tok/s):", s["output_throughput"]),
              _row("Total Token throughput (tok/s):", s["total_token_throughput"]),
              _row("Request goodput (req/s):", s["goodput"]),
              _row("Goodput (% of completed):", 100.0 * s["goodput_fraction"])]
    slo = s["slo"]
    slos = [f"{k} <= {slo[f'{k}_ms']:g} ms" for k in ("ttft", "tpot") if slo[f"{k}_ms"] is not None]
    lines.append(_row("  SLO:", " and ".join(slos) if slos else "none (every completed request)"))
    if s["num_output_mismatch"]:
        lines.append(_row("Requests with output != max_tokens:", s["num_output_mismatch"]))
    for key, title, short in _SECTIONS:
        lines.append(f"{title:-^50}")
        st = s[key]
        lines += [_row(f"Mean {short} (ms):", st["mean"]), _row(f"P50 {short} (ms):", st["p50"]),
                  _row(f"P90 {short} (ms):", st["p90"]), _row(f"P99 {short} (ms):", st["p99"])]
    if s["by_class"]:
        lines.append(f"{'By class (max_tokens: fast <=8, normal <=64, slow)':-^50}")
        lines.append(f"{'class':<7}{'sent':>6}{'ok':>6}{'TTFT p50':>10}{'TTFT p99':>10}"
                     f"{'TPOT p50':>10}{'TPOT p99':>10}{'E2EL p99':>10}{'good %':>8}"
                     f"{'429':>6}{'SLO %':>7}")
        for name, c in s["by_class"].items():
            lines.append(f"{name:<7}{c['num_requests']:>6}{c['completed']:>6}"
                         f"{c['ttft_ms']['p50']:>10.2f}{c['ttft_ms']['p99']:>10.2f}"
                         f"{c['tpot_ms']['p50']:>10.2f}{c['tpot_ms']['p99']:>10.2f}"
                         f"{c['e2el_ms']['p99']:>10.2f}{100 * c['goodput_fraction']:>8.1f}"
                         f"{c.get('num_refused', 0):>6}{100 * c.get('slo_attainment', 0):>7.1f}")
    lines.append("=" * 50)
    return "\n".join(lines)
