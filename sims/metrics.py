"""Per-request metrics with the definitions of `vllm bench serve`, for the simulator
(`sims.report`) and the live load generator (`bench`: `RequestRecord`, `summarize`), written once.

TTFT  first token time − arrival            E2EL  last token time − arrival
TPOT  (E2EL − TTFT) / (output tokens − 1), over requests with more than one output token
ITL   time between consecutive tokens of a request, pooled over all requests; the simulator
      records each step's duration once per sequence that decoded in it (a weighted sample)
Throughput = completed requests (or their output tokens) / (last completion − first arrival).
Goodput    = requests meeting every given SLO (TTFT and TPOT) / the same duration.

The live client's records (arrival = send):

  send      the moment the request left the client (after any --max-concurrency wait)
  TTFT      first token arrival − send
  E2EL      last token arrival − send
  TPOT      (E2EL − TTFT) / (output tokens − 1), over requests with more than one output token
  ITL       gaps between successive token-carrying chunks of a request, pooled over requests.
            A chunk that carries k > 1 tokens (--stream-interval k on the server, or a speculative
            step) counts as ONE arrival and contributes ONE gap, as vLLM's benchmark_serving does:
            ITL then measures what a client sees between deltas, and TPOT stays the per-token figure.
  duration  last completion (of a completed request) − first arrival (the run's start)
  request_throughput = completed requests / duration;  output_throughput = their output tokens / duration
  goodput   a completed request is good when TTFT ≤ --slo-ttft-ms and TPOT ≤ --slo-tpot-ms (each
            only when given; TPOT of a 1-token request is 0). goodput = good / duration (req/s);
            goodput_fraction = good / completed requests (failed requests are counted in
            num_errors, not here), as sims/report.py.
  percentiles p50/p90/p99 with numpy's default linear interpolation; every latency is reported in ms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from scheduler.classes import CLASS_NAMES, DEFAULT_CLASS_BOUNDS, class_index
from scheduler.slo import parse_targets

PCTS = (50, 90, 99)


def stats_ms(values_s: np.ndarray) -> dict[str, float]:
    """{mean, p50, p90, p99} in milliseconds of an array in seconds (NaN-free; empty -> zeros)."""
    v = np.asarray(values_s, dtype=np.float64)
    if v.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    p = np.percentile(v, PCTS)
    return {"mean": float(v.mean()) * 1e3, **{f"p{q}": float(x) * 1e3 for q, x in zip(PCTS, p)}}


def weighted_stats_ms(values_s: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Like `stats_ms` for a sample where values_s[i] occurs weights[i] times (linear interpolation
    between order statistics, as np.percentile does on the expanded sample)."""
    v = np.asarray(values_s, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    ends = np.cumsum(w) - 1.0          # position of each group's last copy in the expanded sample
    total = ends[-1] + 1.0
    out = {"mean": float((v * w).sum() / w.sum()) * 1e3}
    for q in PCTS:
        pos = q / 100.0 * (total - 1.0)
        lo, hi = np.floor(pos), np.ceil(pos)
        v_lo = v[np.searchsorted(ends, lo)]
        v_hi = v[np.searchsorted(ends, hi)]
        out[f"p{q}"] = float(v_lo + (v_hi - v_lo) * (pos - lo)) * 1e3
    return out


def request_metrics(arrival, first_token, finish, num_output, *, slo_ttft_s=None, slo_tpot_s=None):
    """Arrays per completed request -> (ttft, tpot, e2el, good mask)."""
    ttft = first_token - arrival
    e2el = finish - arrival
    multi = num_output > 1
    tpot = np.where(multi, (e2el - ttft) / np.maximum(num_output - 1, 1), 0.0)
    good = np.ones(len(arrival), dtype=bool)
    if slo_ttft_s is not None:
        good &= ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        good &= tpot <= slo_tpot_s
    return ttft, tpot, e2el, good, multi


# ---- the live load generator's records (bench) ------------------------------------------------
def class_of(max_tokens: int, bounds: tuple[int, int] = DEFAULT_CLASS_BOUNDS) -> str:
    """Queue class name of a request from its max_tokens, with the gateway's bounds."""
    return CLASS_NAMES[class_index(max_tokens, bounds)]


@dataclass(slots=True)
class RequestRecord:
    """What the client saw of one request. Times are `time.perf_counter()` seconds.

    chunk_times[j] is the arrival of the j-th chunk that carried at least one token and
    chunk_tokens[j] how many it carried. output_tokens is the server's usage.completion_tokens
    when it sent usage, else sum(chunk_tokens)."""
    index: int
    prompt_len: int
    max_tokens: int
    send_time: float = math.nan
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0
    error: str | None = None          # short kind: http_429, timeout, connection, stream_error, ...
    error_detail: str = ""
    retry_after_s: float = math.nan   # a refusal's Retry-After (retry-after-ms when sent)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def first_token_time(self) -> float:
        return self.chunk_times[0]

    @property
    def finish_time(self) -> float:
        return self.chunk_times[-1]

    def itl(self) -> list[float]:
        t = self.chunk_times
        return [t[j] - t[j - 1] for j in range(1, len(t))]


def _latencies(done: list[RequestRecord], slo_ttft_s, slo_tpot_s):
    send = np.array([r.send_time for r in done], dtype=np.float64)
    first = np.array([r.first_token_time for r in done], dtype=np.float64)
    finish = np.array([r.finish_time for r in done], dtype=np.float64)
    num_out = np.array([r.output_tokens for r in done], dtype=np.int64)
    ttft, tpot, e2el, good, multi = request_metrics(send, first, finish, num_out,
                                                    slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    itl = np.array([g for r in done for g in r.itl()], dtype=np.float64)
    return {"ttft_ms": stats_ms(ttft), "tpot_ms": stats_ms(tpot[multi]), "itl_ms": stats_ms(itl),
            "e2el_ms": stats_ms(e2el)}, good, finish, num_out


def _ms_to_s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def _group(records: list[RequestRecord], duration: float, slo_ttft_ms, slo_tpot_ms) -> dict:
    done = [r for r in records if r.ok]
    lat, good, _, num_out = _latencies(done, _ms_to_s(slo_ttft_ms), _ms_to_s(slo_tpot_ms))
    num_good = int(good.sum())
    rate = (lambda x: x / duration) if duration else (lambda x: 0.0)
    return {
        "num_requests": len(records),
        "completed": len(done),
        "num_errors": len(records) - len(done),
        "request_throughput": rate(len(done)),
        "output_throughput": rate(int(num_out.sum())),
        **lat,
        "goodput": rate(num_good),
        "goodput_fraction": float(good.mean()) if done else 0.0,
        "num_good": num_good,
        # of every request sent, the share that met its targets: a refused one (429) did not
        "slo_attainment": num_good / len(records) if records else 0.0,
        "num_refused": sum(1 for r in records if r.error == "http_429"),
        "retry_after_ms": stats_ms(np.array([r.retry_after_s for r in records
                                             if r.retry_after_s == r.retry_after_s])),
    }


def run_duration(records: list[RequestRecord], start_time: float | None = None) -> float:
    """Last completion − first arrival (start_time, default the earliest send); 0 when nothing
    completed, and at least 1e-12 s otherwise (as sims.report)."""
    done = [r for r in records if r.ok]
    if not done:
        return 0.0
    if start_time is None:
        start_time = min(r.send_time for r in records if not math.isnan(r.send_time))
    return max(max(r.finish_time for r in done) - start_time, 1e-12)


def summarize(records: list[RequestRecord], *, start_time: float | None = None,
              slo_ttft_ms=None, slo_tpot_ms=None) -> dict:
    """The JSON report: throughput, latency stats, goodput, by_class, errors. The keys it shares
    with `sims.report.summarize` (completed, duration_s, request/output/total_token_throughput,
    ttft/tpot/itl/e2el_ms, goodput, goodput_fraction, slo, by_class[c].completed/ttft_ms/
    tpot_ms/e2el_ms/goodput_fraction) have the same meaning and values for the same timings."""
    duration = run_duration(records, start_time)
    ttft_by, tpot_by = parse_targets(slo_ttft_ms), parse_targets(slo_tpot_ms)
    if len(set(ttft_by)) == 1 and len(set(tpot_by)) == 1:  # one target for every class
        out = _group(records, duration, ttft_by[0], tpot_by[0])
    else:  # per class (scheduler.slo): overall goodput is the classes' together
        parts = [_group([r for r in records if class_of(r.max_tokens) == name], duration,
                        ttft_by[c], tpot_by[c]) for c, name in enumerate(CLASS_NAMES)]
        out = _group(records, duration, None, None)
        num_good = sum(g["num_good"] for g in parts)
        done_n = out["completed"]
        out.update(goodput=num_good / duration if duration else 0.0, num_good=num_good,
                   goodput_fraction=num_good / done_n if done_n else 0.0,
                   slo_attainment=num_good / len(records) if records else 0.0)
    done = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            kind = r.error or "no_tokens"
            errors[kind] = errors.get(kind, 0) + 1
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_tokens for r in done)
    out.update({
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
        "slo": ({"ttft_ms": ttft_by[0], "tpot_ms": tpot_by[0]}
                if len(set(ttft_by)) == 1 and len(set(tpot_by)) == 1 else
                {"ttft_ms": dict(zip(CLASS_NAMES, ttft_by)),
                 "tpot_ms": dict(zip(CLASS_NAMES, tpot_by))}),
        "num_output_mismatch": sum(r.output_tokens != r.max_tokens for r in done),
        "errors": errors,
        "by_class": {},
    })
    for c, name in enumerate(CLASS_NAMES):
        members = [r for r in records if class_of(r.max_tokens) == name]
        if members:
            out["by_class"][name] = _group(members, duration, ttft_by[c], tpot_by[c])
    return out
