"""`python -m bench.engine.steps` end to end on the CPU (tiny preset): every section runs, the JSON has
the documented keys, the profile JSON loads into the simulator's measured cost model."""
from __future__ import annotations

import json

import pytest
import torch

from bench.engine import steps as engine_bench


def test_bench_cpu_end_to_end(tmp_path):
    out, prof = tmp_path / "engine.json", tmp_path / "profile.json"
    rc = engine_bench.main(["--device", "cpu", "--preset", "tiny", "--layers", "2", "--context", "16",
                     "--decode-batches", "1,3", "--prefill-tokens", "32,64",
                     "--profile-contexts", "40", "--steps", "2", "--warmup", "1",
                     "--host-batch", "3", "--host-steps", "3", "--buckets", "1,2,4",
                     "--peer-batches", "1", "--peer-new-tokens", "3",
                     "--out", str(out), "--profile-out", str(prof)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert not res["errors"], res["errors"]
    meta = res["meta"]
    assert meta["reduced_depth"] and meta["num_layers"] == 2 and meta["graphs_emulated"]
    assert {"copy_bytes_per_s", "matmul_flops_per_s"} <= set(res["ceilings"])
    keys = {"weights", "batch", "graphs", "ms_per_token", "tokens_per_s", "floor_ms",
            "fraction_of_floor"}
    assert {(r["weights"], r["batch"], r["graphs"]) for r in res["decode"]} == {
        (w, b, g) for w in ("bf16", "fp8") for b in (1, 3) for g in (True, False)}
    for r in res["decode"]:
        assert keys <= set(r) and r["ms_per_token"] > 0 and 0 < r["fraction_of_floor"]
    assert {(r["weights"], r["tokens"]) for r in res["prefill"]} == {
        (w, t) for w in ("bf16", "fp8") for t in (32, 64)}
    for r in res["prefill"]:
        assert {"weights", "tokens", "ms", "fraction_of_ceiling"} <= set(r)
    assert res["cuda_graphs"]["bf16"]["buckets"] == [1, 2, 4]
    assert res["meta"]["weight_bytes_fp8"] < 0.6 * res["meta"]["weight_bytes_bf16"]
    assert res["host_time"]["batch"] == 3 and res["host_time"]["host_ms"] > 0
    assert res["checks"]["graph_vs_torch_rel_err"] < 1e-4
    peer = res["peer"]
    assert peer["library"] == "transformers" and peer["decode"][0]["batch"] == 1
    assert peer["decode"][0]["ms_per_token"] > 0 and peer["prefill"][0]["tokens"] == 64
    assert len(res["goals"]) == 12 and all("met" in g for g in res["goals"])

    from sims.profile_cost import ProfileCost

    doc = json.loads(prof.read_text())
    assert doc["format"] == "tidegate-profile/1" and doc["reduced_depth"]
    shapes = {(p["num_decode_seqs"], p["num_prefill_tokens"], p["context_len"]) for p in doc["points"]}
    assert {(0, 32, 0), (0, 64, 0)} <= shapes and any(d == 3 and c > 40 for d, _, c in shapes)
    for p in doc["points"]:
        assert p["num_context_tokens"] == p["num_decode_seqs"] * p["context_len"] + p["num_prefill_tokens"]
    assert ProfileCost.from_json(prof).step_time(3, 0, 100) > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_bench_refuses_cuda_without_a_gpu(capsys):
    assert engine_bench.main(["--device", "cuda"]) == 1
    assert "CUDA is not available" in capsys.readouterr().err


def test_tidegate_bench_engine_forwards(capsys):
    from bench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["engine", "--help"])
    assert exc.value.code == 0
    assert "--quantization" not in capsys.readouterr().out  # the bench's own options


def test_kernel_breakdown_splits_steps_and_counts_gaps():
    """Two steps of three kernels (a cuBLAS GEMV, our norm, our attention) 10 ms apart: the
    per-step busy time, idle gaps and category totals follow from the records."""
    step = [("gemv2T_kernel_val<int, 128>", 0.0, 10.0), ("_rms_norm_kernel", 12.0, 3.0),
            ("_paged_attention_kernel", 16.0, 4.0)]
    recs = [(n, s + off, d) for off in (0.0, 10_000.0) for n, s, d in step]
    bd = engine_bench.kernel_breakdown(recs, [0.5, 0.7])
    assert bd["steps"] == 2 and bd["kernels_per_step"] == 3 and bd["wall_ms"] == 0.6
    assert bd["busy_us"] == 17.0 and bd["span_us"] == 20.0 and bd["gap_us"] == 3.0
    cats = bd["categories"]
    assert cats["matmul (cuBLAS)"] == {"us": 10.0, "count": 1, "share": 10 / 17,
                                       "chain_us": 12.0}   # start to the next kernel's start
    assert cats["rms norm"]["us"] == 3.0 and cats["paged attention"]["count"] == 1
    assert cats["rms norm"]["chain_us"] == 4.0 and cats["paged attention"]["chain_us"] == 4.0
    assert [t["idle_before_us"] for t in bd["timeline"]] == [0.0, 2.0, 1.0]
    assert [t["start_us"] for t in bd["timeline"]] == [0.0, 12.0, 16.0]
    assert engine_bench.kernel_category("_fp8_gemv_fma_kernel") == "fp8 gemv"
    assert engine_bench.kernel_category("_gemv_row_kernel") == "fp8 gemv"
    assert engine_bench.kernel_category("_splitk_reduce_kernel") == "split-k reduce"
