"""/metrics carries vLLM's metric names with vLLM's label sets, so routers built for vLLM (the
production-stack router, llm-d's scheduler) can read tidegate. The expected list is taken from
vLLM's "Production Metrics" documentation (V1 engine: series labelled model_name and engine)."""
from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, post

from gateway.app import create_app

ENGINE = {"model_name", "engine"}
# (family name as parsed, type, label names; histograms: of the _bucket series without "le")
VLLM_DOCUMENTED = [
    ("vllm:num_requests_running", "gauge", ENGINE),
    ("vllm:num_requests_waiting", "gauge", ENGINE),
    ("vllm:kv_cache_usage_perc", "gauge", ENGINE),
    ("vllm:gpu_cache_usage_perc", "gauge", ENGINE),
    ("vllm:prefix_cache_queries", "counter", ENGINE),
    ("vllm:prefix_cache_hits", "counter", ENGINE),
    ("vllm:num_preemptions", "counter", ENGINE),
    ("vllm:prompt_tokens", "counter", ENGINE),
    ("vllm:generation_tokens", "counter", ENGINE),
    ("vllm:request_success", "counter", ENGINE | {"finished_reason"}),
    ("vllm:time_to_first_token_seconds", "histogram", ENGINE),
    ("vllm:inter_token_latency_seconds", "histogram", ENGINE),
    ("vllm:time_per_output_token_seconds", "histogram", ENGINE),
    ("vllm:e2e_request_latency_seconds", "histogram", ENGINE),
    ("vllm:request_queue_time_seconds", "histogram", ENGINE),
]
CACHE_CONFIG_LABELS = {"engine", "block_size", "cache_dtype", "enable_prefix_caching",
                       "num_gpu_blocks"}


@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address(), report_s=0.02,
                          info_extra={"kv_cache_dtype": "fp8", "enable_prefix_caching": True},
                          report_extra={"num_prompt_tokens": 100, "num_cached_prompt_tokens": 40,
                                        "num_preemptions": 3}).start()
    yield b
    await b.stop()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


async def test_vllm_names_and_label_sets(aiohttp_client, backend):
    client = await aiohttp_client(create_app(make_config(backend.address), startup_wait_s=5.0))
    await post(client, "/v1/completions", {"prompt": "hi", "max_tokens": 4})
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4,
                                                      "stream": True})
    await resp.read()
    got = families(await (await client.get("/metrics")).text())
    for name, kind, labels in VLLM_DOCUMENTED:
        assert name in got, name
        fam = got[name]
        assert fam.type == kind, (name, fam.type)
        samples = [s for s in fam.samples if not s.name.endswith(("_created", "_sum", "_count"))]
        assert samples, name
        for s in samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)
    info = got["vllm:cache_config_info"]
    (sample,) = info.samples
    assert CACHE_CONFIG_LABELS <= set(sample.labels) and sample.value == 1
    assert sample.labels["cache_dtype"] == "fp8" and sample.labels["block_size"] == "16"
    assert sample.labels["enable_prefix_caching"] == "True"
    assert sample.labels["engine"] == backend.address


def value(fams, name, suffix="", **labels) -> float:
    return sum(s.value for s in fams[name].samples if s.name == name + suffix
               and all(s.labels.get(k) == v for k, v in labels.items()))


async def test_values_per_engine(aiohttp_client, backend):
    client = await aiohttp_client(create_app(make_config(backend.address), startup_wait_s=5.0))
    for _ in range(3):
        await post(client, "/v1/completions", {"prompt": "hi", "max_tokens": 5})
    fams = families(await (await client.get("/metrics")).text())
    eng = {"engine": backend.address, "model_name": "tiny"}
    assert value(fams, "vllm:prompt_tokens", "_total", **eng) == 9  # BOS + "hi", 3 times
    assert value(fams, "vllm:generation_tokens", "_total", **eng) == 15
    assert value(fams, "vllm:time_to_first_token_seconds", "_count", **eng) == 3
    assert value(fams, "vllm:request_queue_time_seconds", "_count", **eng) == 3
    assert value(fams, "vllm:request_success", "_total", finished_reason="length", **eng) == 3
    # cumulative counters from the LoadReports, counted once however often they repeat
    assert value(fams, "vllm:prefix_cache_queries", "_total", **eng) == 100
    assert value(fams, "vllm:prefix_cache_hits", "_total", **eng) == 40
    assert value(fams, "vllm:num_preemptions", "_total", **eng) == 3
    backend.report_extra.update(num_prompt_tokens=130, num_cached_prompt_tokens=50)
    await asyncio.sleep(0.2)
    fams = families(await (await client.get("/metrics")).text())
    assert value(fams, "vllm:prefix_cache_queries", "_total", **eng) == 130
    assert value(fams, "vllm:prefix_cache_hits", "_total", **eng) == 50
    assert value(fams, "vllm:num_requests_waiting", engine="gateway") == 0
