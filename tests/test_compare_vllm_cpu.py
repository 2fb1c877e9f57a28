"""The vLLM CPU comparison records which CPU it ran on (issue 27: its ratio flips between an
AVX2-only CPU and one with bf16 arithmetic)."""
from bench.serving.compare_vllm import cpu_description, table

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2 fma\n"
BF16 = "model name\t: Intel(R) Xeon(R)\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16\n"


def test_cpu_description_names_the_bf16_flags_present_and_absent():
    assert cpu_description(AVX2_ONLY) == \
        "AMD EPYC 7B13; avx2 no-avx512f no-avx512_bf16 no-amx_bf16"
    assert cpu_description(BF16) == "Intel(R) Xeon(R); avx2 avx512f avx512_bf16 amx_bf16"
    assert cpu_description("") == "unknown; no-avx2 no-avx512f no-avx512_bf16 no-amx_bf16"


def test_the_table_says_which_cpu():
    row = {"model": "m", "rate": "inf", "ready_s": 1.0, "load_before": 1.0, "load_after": 1.0,
           "request_throughput": 2.0, "output_throughput": 1.0, "p50_ttft_ms": 1.0,
           "p99_ttft_ms": 1.0, "p50_tpot_ms": 1.0, "p50_itl_ms": 1.0, "p50_e2el_ms": 1.0}
    rows = [{**row, "server": "tidegate", "cpu": cpu_description(BF16)},
            {**row, "server": "vllm", "cpu": cpu_description(BF16)}]
    assert table(rows).rstrip().endswith("CPU: Intel(R) Xeon(R); avx2 avx512f avx512_bf16 amx_bf16")
    earlier = [{k: v for k, v in r.items() if k != "cpu"} for r in rows]  # rows before the field
    assert "CPU: not recorded" in table(earlier)
