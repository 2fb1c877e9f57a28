"""A record of the batching decisions: which requests arrived when, and which left in which window.

Both sides write the same records, so that a live run and a simulated replay of its arrivals can
be compared decision by decision (`bench.simulator.decision_fidelity`):

    {"kind": "arrival", "id": "r7", "t": 12.5, "prompt": 512, "max_tokens": 128, "class": 1,
     "received": 12.4997}     (+ "refused": true, "slo_ttft_ms": 5000 where they apply, and
                               "pred_ms"/"margin_ms": admission's prediction and margin)
    {"kind": "batch", "t": 12.505, "size": 2, "ids": ["r6", "r7"], "classes": [1, 1]}
    {"kind": "step", "t": 12.52, "ms": 20.1, "decodes": 14, "prefill": [["r6", 512, 0]],
     "preempted": []}

The arrival records are the trace the simulator replays (`sims.decision_replay`); the batch
records are the decisions. Times are the writer's clock (the gateway's monotonic clock, or the
simulator's virtual one). An arrival's `t` is when the batcher took the request (the push, which
opens a window); `received` (optional) is the gateway's earlier stamp of the HTTP request, so the
log also shows what the front end (body, tokenizer, handle) took before the batcher saw it. The log is opt-in: callers hold `None` when it is off, so the cost of
"off" is one `is None` test per arrival and per flushed window.

Stdlib only (scheduler/ stays pure); a log may keep its records in memory or append them to a
text file as JSON lines.

Step records are the backend's decisions: each step's prefill chunks (request, tokens, first
position), how many sequences decoded, which were preempted. The live backend writes them with
`--step-log` (backend.server.step_log, the same fields), the simulator with `EngineConfig.record_steps`;
`bench.simulator.decision_fidelity.compare_steps` sets them side by side.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True, slots=True)
class ArrivalRecord:
    request_id: str
    t: float
    num_prompt_tokens: int
    max_tokens: int
    queue_class: int
    received: float | None = None  # the gateway's HTTP stamp, <= t (None: not recorded)
    refused: bool = False  # admission refused it (scheduler.admission): in no window
    slo_ttft_ms: float | None = None  # its own TTFT target (the request's field), if it gave one
    # admission's predicted TTFT and calibration margin at its arrival (ms; None: not checked)
    predicted_ms: float | None = None
    margin_ms: float | None = None

    def to_json(self) -> dict:
        d = {"kind": "arrival", "id": self.request_id, "t": self.t,
             "prompt": self.num_prompt_tokens, "max_tokens": self.max_tokens,
             "class": self.queue_class}
        if self.received is not None:
            d["received"] = self.received
        if self.refused:
            d["refused"] = True
        if self.slo_ttft_ms is not None:
            d["slo_ttft_ms"] = self.slo_ttft_ms
        if self.predicted_ms is not None:
            d["pred_ms"] = self.predicted_ms
            d["margin_ms"] = self.margin_ms
        return d


@dataclass(frozen=True, slots=True)
class BatchRecord:
    t: float  # when the window was flushed
    request_ids: tuple[str, ...]  # in the order the batcher handed them out
    classes: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.request_ids)

    def to_json(self) -> dict:
        return {"kind": "batch", "t": self.t, "size": self.size,
                "ids": list(self.request_ids), "classes": list(self.classes)}


@dataclass(frozen=True, slots=True)
class StepRecord:
    t: float  # when the step started (the writer's clock)
    num_decodes: int
    prefill: tuple[tuple[str, int, int], ...]  # (request id, tokens, first position) per chunk
    preempted: tuple[str, ...] = ()
    ms: float | None = None  # its duration, where measured

    def to_json(self) -> dict:
        d = {"kind": "step", "t": self.t, "decodes": self.num_decodes,
             "prefill": [list(c) for c in self.prefill], "preempted": list(self.preempted)}
        if self.ms is not None:
            d["ms"] = self.ms
        return d


def step_from_json(d: dict) -> StepRecord:
    """A step record from its JSON (a `--step-log` line: `kind` may be absent there)."""
    ms = d.get("ms")
    return StepRecord(float(d["t"]), int(d["decodes"]),
                      tuple((str(r), int(n), int(p)) for r, n, p in d.get("prefill", ())),
                      tuple(str(r) for r in d.get("preempted", ())),
                      None if ms is None else float(ms))


class DecisionLog:
    """Collects arrival and batch records; with `sink`, also writes each as one JSON line."""

    def __init__(self, sink: TextIO | None = None, keep: bool = True) -> None:
        self.sink = sink
        self.keep = keep  # False: only write (a long live run need not hold every record)
        self.arrivals: list[ArrivalRecord] = []
        self.batches: list[BatchRecord] = []

    @classmethod
    def open(cls, path: str) -> DecisionLog:
        """Append to `path` (line-buffered: a crashed gateway still leaves whole lines)."""
        return cls(open(path, "a", buffering=1, encoding="utf-8"), keep=False)

    def arrival(self, request_id: str, t: float, num_prompt_tokens: int, max_tokens: int,
                queue_class: int, received: float | None = None, refused: bool = False,
                slo_ttft_ms: float | None = None, predicted_ms: float | None = None,
                margin_ms: float | None = None) -> None:
        self._add(self.arrivals, ArrivalRecord(
            request_id, float(t), int(num_prompt_tokens), int(max_tokens), int(queue_class),
            None if received is None else float(received), bool(refused),
            None if slo_ttft_ms is None else float(slo_ttft_ms),
            None if predicted_ms is None else round(float(predicted_ms), 3),
            None if margin_ms is None else round(float(margin_ms), 3)))

    def batch(self, t: float, request_ids: Iterable[str], classes: Iterable[int]) -> None:
        self._add(self.batches, BatchRecord(float(t), tuple(request_ids),
                                            tuple(int(c) for c in classes)))

    def _add(self, into: list, rec: ArrivalRecord | BatchRecord) -> None:
        if self.keep:
            into.append(rec)
        if self.sink is not None:
            self.sink.write(json.dumps(rec.to_json(), separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None


def parse_records(lines: Iterable[str]) -> tuple[list[ArrivalRecord], list[BatchRecord]]:
    """Read JSON lines back (blank lines skipped); raises ValueError on a record it cannot read."""
    arrivals: list[ArrivalRecord] = []
    batches: list[BatchRecord] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if d["kind"] == "arrival":
                received = d.get("received")
                own, pm, mm = d.get("slo_ttft_ms"), d.get("pred_ms"), d.get("margin_ms")
                arrivals.append(ArrivalRecord(str(d["id"]), float(d["t"]), int(d["prompt"]),
                                              int(d["max_tokens"]), int(d["class"]),
                                              None if received is None else float(received),
                                              bool(d.get("refused", False)),
                                              None if own is None else float(own),
                                              None if pm is None else float(pm),
                                              None if mm is None else float(mm)))
            elif d["kind"] == "batch":
                batches.append(BatchRecord(float(d["t"]), tuple(str(i) for i in d["ids"]),
                                           tuple(int(c) for c in d["classes"])))
            elif d["kind"] == "step":
                continue  # read_steps reads these
            else:
                raise ValueError(f"unknown kind {d['kind']!r}")
        except (KeyError, TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"decision log line {n}: {exc}") from exc
    return arrivals, batches


def read_steps(path: str) -> list[StepRecord]:
    """The step records of a file: a decision log's "step" lines, or a backend `--step-log`
    (one step a line, no `kind`); gzip when the name ends .gz. Lines without request ids (an
    older step log) give steps with no prefill ids: raises ValueError, as they cannot be compared."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            if d.get("kind", "step") != "step":
                continue
            if d.get("prefill_tokens") and "prefill" not in d:
                raise ValueError(f"{path} line {n}: a step log without request ids")
            out.append(step_from_json(d))
    return out


def read_log(path: str) -> tuple[list[ArrivalRecord], list[BatchRecord]]:
    """A log file, or a gzip of one (name ending .gz: how committed results keep them)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return parse_records(f)
