"""Speculative decoding counted by draft source (issue 28): the Speculator's counters per source
(drafts, draft tokens, accepted tokens, accepted tokens per draft position), the engine's load
report and the wire's LoadReport.spec_decode (a new repeated field: old reports parse with none),
and the gateway's /metrics under vLLM's spec-decode names with a `source` label: increases since
the last report, a restarted backend, and a backend that reports no sources counted per request
(source "unknown") without counting the others twice."""
from __future__ import annotations

import re

from gateway.prometheus_metrics import GatewayMetrics
from gateway.vllm_metrics import EngineReport
from proto import tidegate_pb2 as pb
from scheduler.speculation import SourceCounters, SpeculationConfig, Speculator


def test_speculator_counts_by_source_and_position():
    sp = Speculator(SpeculationConfig())
    sp.add("r", [1, 2, 3], prediction=[10, 11, 12, 13, 14, 15])
    for drafted, accepted, source in ((4, 2, "prediction"), (3, 3, "prediction"),
                                      (2, 0, "prompt")):
        sp.get("r").last_source = source
        sp.verified("r", drafted, accepted)
    by = {c.source: c for c in sp.source_counters()}
    assert by["prediction"] == SourceCounters("prediction", 2, 7, 5, (2, 2, 1, 0))
    assert by["prompt"] == SourceCounters("prompt", 1, 2, 0, (0, 0))
    assert by["session"] == SourceCounters("session", 0, 0, 0, ())  # reported, at zero
    only = Speculator(SpeculationConfig(sources=("prompt",)))
    assert [c.source for c in only.source_counters()] == ["prompt"]


def test_engine_load_reports_the_speculators_counters():
    from test_speculation_engine import _engine, _greedy_case

    _, _, _, _, eng = _greedy_case({})
    counters = eng.load().spec_decode
    sp = eng.speculator
    assert counters == sp.source_counters()
    by = {c.source: c for c in counters}
    assert by["prediction"].num_accepted_tokens == sp.num_accepted["prediction"] > 0
    for c in counters:  # the per-position counts add up to the accepted tokens
        assert sum(c.num_accepted_tokens_per_pos) == c.num_accepted_tokens
        assert c.num_accepted_tokens <= c.num_draft_tokens
    assert _engine(None).load().spec_decode == ()  # an engine that does not speculate


def test_load_report_field_round_trips_and_old_reports_have_none():
    report = pb.LoadReport(num_running=2)
    report.spec_decode.add(source="prediction", num_drafts=3, num_draft_tokens=12,
                           num_accepted_tokens=9, num_accepted_tokens_per_pos=[3, 3, 2, 1])
    back = pb.LoadReport.FromString(report.SerializeToString())
    assert back == report and list(back.spec_decode[0].num_accepted_tokens_per_pos) == [3, 3, 2, 1]
    old = pb.LoadReport(num_running=2, num_free_blocks=7).SerializeToString()  # a 1.2 backend
    assert len(pb.LoadReport.FromString(old).spec_decode) == 0


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}{{([^}}]*)}} (\S+)$", text, re.MULTILINE):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _report(engine: str, *spec) -> EngineReport:
    return EngineReport(engine=engine, healthy=True, num_running=0, num_waiting=0,
                        kv_cache_usage=0.0, spec_decode=tuple(spec))


def test_metrics_by_source_from_load_reports():
    m = GatewayMetrics("tiny")
    a = "ipc://a"
    m.refresh({}, {}, [], [_report(a, ("prediction", 2, 8, 6, (2, 2, 1, 1)),
                                   ("prompt", 1, 4, 1, (1, 0, 0, 0)))])
    m.refresh({}, {}, [], [_report(a, ("prediction", 5, 20, 15, (5, 4, 3, 3)),
                                   ("prompt", 1, 4, 1, (1, 0, 0, 0)))])
    text = m.render().decode()
    name = "vllm:spec_decode_num_accepted_tokens_total"
    assert _value(text, name, engine=a, source="prediction", model_name="tiny") == 15
    assert _value(text, name, source="prompt") == 1
    assert _value(text, "vllm:spec_decode_num_drafts_total", source="prediction") == 5
    assert _value(text, "vllm:spec_decode_num_draft_tokens_total") == 24
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [_value(text, per_pos, source="prediction", position=str(i)) for i in range(4)] == \
        [5, 4, 3, 3]
    # the backend restarted: its counts start again from what it reports now
    m.refresh({}, {}, [], [_report(a, ("prediction", 1, 4, 2, (1, 1)))])
    text = m.render().decode()
    assert _value(text, name, source="prediction") == 17
    assert _value(text, per_pos, source="prediction", position="0") == 6


def test_requests_count_only_where_the_backend_reports_no_sources():
    m = GatewayMetrics("tiny")
    # a backend that reports by source: its requests' counters are not added again
    m.observe_speculation("ipc://a", "prediction", 3, 12, 9, 20, 4, engine_reports_sources=True)
    # one that does not (an older backend, another engine behind the wire): counted per request
    m.observe_speculation("ipc://b", "auto", 2, 6, 3, 0, 0)
    text = m.render().decode()
    tokens = "vllm:spec_decode_num_draft_tokens_total"
    assert _value(text, tokens, engine="ipc://a") == 0
    assert _value(text, tokens, engine="ipc://b", source="unknown") == 6
    assert _value(text, "vllm:spec_decode_num_drafts_total", engine="ipc://b") == 2
    # the per-request tidegate series count both (by request kind)
    assert _value(text, "tidegate_spec_decode_num_draft_tokens_total") == 18


def test_bench_acceptance_by_source():
    from bench.serving.edit import acceptance_by_source

    spec = {'vllm:spec_decode_num_draft_tokens_total{source="prediction"}': 40.0,
            'vllm:spec_decode_num_accepted_tokens_total{source="prediction"}': 30.0,
            'vllm:spec_decode_num_draft_tokens_total{source="prompt"}': 10.0,
            'vllm:spec_decode_num_draft_tokens_total{source="session"}': 0.0,
            "vllm:spec_decode_num_draft_tokens_total": 50.0}
    assert acceptance_by_source(spec) == {"prediction": 0.75, "prompt": 0.0}
