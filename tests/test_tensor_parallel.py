"""Tensor parallelism on the CPU: 2 processes over gloo (backend.server.ranks).

TP=2 must give the TP=1 logits (fp32, up to summation order) on test checkpoints that cover
split KV heads, replicated KV heads (one KV head, two ranks), tied and untied LM heads, an odd
vocabulary (padded on the last rank), random weights, an FP8 KV pool and FP8 weights; the step
plan travels from rank 0 exactly as in serving (`LeaderRunner` / `follow`). Through
`tidegate backend --tensor-parallel-size 2`: greedy tokens equal transformers', and killing a
rank answers the request in flight with an error and stops the backend (exit 1, no hang).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from unittest.mock import patch

import pytest
import torch

from backend.config import ConfigError, ModelConfig
from backend.distributed.sharding import Shard, check_tp_size
from backend.engine.assemble import BackendConfig
from tests.backend_helpers import (
    CHECKPOINTS,
    BlockAllocator,
    Chunk,
    DealerClient,
    WorkerProcess,
    hf_greedy,
    hf_model,
    make_checkpoint,
)

# one KV head for two ranks: each rank holds a copy (the replicated case)
MQA = {"vocab_size": 259, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": False}
BLOCK = 4
# the graph buckets the fixed plan's steps fall in (decode 2-3 seqs, mixed <= 64 tokens)
GPU_SERVING_KW = {"cuda_graph_buckets": "1,2,4", "cuda_graph_token_buckets": "16,32,64"}


def _config(**kw) -> ModelConfig:
    base = {"vocab_size": 11, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 2, "rms_norm_eps": 1e-6,
            "rope_theta": 1e4, "rope_scaling_factor": 1.0, "max_position_embeddings": 64,
            "tie_word_embeddings": False, "bos_token_id": None, "eos_token_ids": (),
            "torch_dtype": "float32"}
    return ModelConfig(**{**base, **kw})


# ---- the arithmetic ---------------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 4, 8])
def test_pieces_put_back_together_are_the_full_weights(size):
    c = _config()
    full = {"layers.0.self_attn.qkv_proj.weight": torch.randn(c.q_size + 2 * c.kv_size, 16),
            "layers.0.mlp.gate_up_proj.weight": torch.randn(2 * c.intermediate_size, 16),
            "layers.0.self_attn.o_proj.weight": torch.randn(16, c.q_size),
            "layers.0.mlp.down_proj.weight": torch.randn(16, c.intermediate_size),
            "embed_tokens.weight": torch.randn(11, 16)}
    shards = [Shard(c, r, size) for r in range(size)]
    for name, w in full.items():
        assert shards[0].full_shape(name, ()) == tuple(w.shape)
        pieces = [s.take(name, w) for s in shards]
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            torch.testing.assert_close(torch.cat(pieces, 1), w)
        elif name == "embed_tokens.weight":  # padded to ceil(11 / size) rows each, zeros past 11
            rows = shards[0].vocab_rows
            assert all(p.shape[0] == rows for p in pieces)
            torch.testing.assert_close(torch.cat(pieces)[:11], w)
            assert not torch.cat(pieces)[11:].any()
        elif name.endswith("gate_up_proj.weight"):
            i = c.intermediate_size
            torch.testing.assert_close(torch.cat([p[:i // size] for p in pieces]), w[:i])
            torch.testing.assert_close(torch.cat([p[i // size:] for p in pieces]), w[i:])
    # query heads and the KV head(s) each rank's heads read (GQA: head h reads h // 4)
    for s in shards:
        heads = range(s.rank * s.num_heads, (s.rank + 1) * s.num_heads)
        kv = range(s.first_kv_head, s.first_kv_head + s.num_kv_heads)
        assert {h // c.num_queries_per_kv for h in heads} <= set(kv)
        local = s.local_config()
        assert (local.num_attention_heads, local.num_key_value_heads) == \
            (8 // size, max(1, 2 // size))
        assert local.vocab_size == 11 and local.head_dim == 2


def test_sizes_that_do_not_split_the_model_are_refused():
    with pytest.raises(ConfigError, match="does not divide the 8 attention heads"):
        check_tp_size(_config(), 3)
    with pytest.raises(ConfigError, match="KV heads"):
        check_tp_size(_config(num_attention_heads=12, num_key_value_heads=3), 2)
    with pytest.raises(ConfigError, match="intermediate_size"):
        check_tp_size(_config(intermediate_size=6), 4)


def test_the_step_plan_reaches_a_follower_as_sent():
    """Block tables travel as deltas; what a follower rebuilds is what rank 0 planned, through
    growth, a request leaving and coming back, and a table rebuilt after preemption."""
    from backend.server.rank_steps import PlanDecoder, PlanEncoder

    enc, dec = PlanEncoder(block_size=4), PlanDecoder()
    tables = {"a": [7, 3], "b": [9]}

    def step(*chunks):
        got = dec.decode(enc.encode(chunks).tolist())
        for c, g in zip(chunks, got):
            nb = -(-(c.start_pos + len(c.token_ids)) // 4)
            assert (g.token_ids, g.start_pos, g.block_table, g.is_prefill, g.sample) == \
                (c.token_ids, c.start_pos, c.block_table[:nb], c.is_prefill, c.sample)
        return [g.request_id for g in got]

    first = step(Chunk("a", [1, 2, 3, 4, 5], 0, tables["a"]), Chunk("b", [6], 0, tables["b"]))
    tables["a"].append(11)  # a's decode starts its third block
    assert step(Chunk("a", [8], 8, tables["a"], False), Chunk("b", [9], 1, tables["b"], False)) \
        == first  # same requests, same serials
    assert step(Chunk("b", [9], 2, tables["b"], False))[0] == first[1]
    # a was out of a step: a new serial and its whole table
    again = step(Chunk("a", [5], 9, tables["a"], False))
    assert again[0] != first[0]
    # preempted and scheduled again with other blocks: a new serial too
    tables["a"] = [4, 5]
    assert step(Chunk("a", [1, 2, 3, 4, 5], 0, tables["a"]))[0] not in (first[0], again[0])


# ---- two ranks over gloo: logits -------------------------------------------------------------

# name -> (checkpoint, BackendConfig overrides, quantize weights to fp8)
CASES = {
    "kv_split_untied_oddvocab": ("gqa1_untied_oddvocab", {}, False),
    "tied_gqa_rope": ("gqa4_tied_rope4", {}, False),
    "kv_replicated": ("tp_mqa", {}, False),
    "dummy_weights": ("gqa1_untied_oddvocab", {"load_format": "dummy", "seed": 3}, False),
    "fp8_kv_cache": ("gqa4_tied_rope4", {"kv_cache_dtype": "fp8"}, False),
    "fp8_weights": ("gqa1_untied_oddvocab", {}, True),
}


def _steps(vocab: int):
    """A fixed plan: two prefills, then decodes fed with greedy tokens, a prefill joining them."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 13, 5)]


def _run(runner, prompts) -> list[torch.Tensor]:
    """Logits of every step of the fixed plan (decode tokens are the argmax of the last ones)."""
    alloc = BlockAllocator(BLOCK)
    lens = {}

    def prefill(rid, ids):
        lens[rid] = len(ids)
        return Chunk(rid, ids, 0, alloc.table(rid, len(ids)))

    def decode(rid, tok):
        lens[rid] += 1
        return Chunk(rid, [tok], lens[rid] - 1, alloc.table(rid, lens[rid]), is_prefill=False)

    out = []
    steps = [[prefill("a", prompts[0]), prefill("b", prompts[1])]]
    for i in range(4):
        logits = runner.execute(steps[-1], keep_logits=True).logits
        out.append(logits)
        toks = logits.argmax(-1).tolist()
        chunks = [decode(c.request_id, t) for c, t in zip(steps[-1], toks)]
        if i == 1:
            chunks.append(prefill("c", prompts[2]))
        steps.append(chunks)
    return out


def _backend_config(path: Path, overrides: dict, device: str = "cpu") -> BackendConfig:
    return BackendConfig(model=str(path), num_blocks=64, block_size=BLOCK, max_num_seqs=8,
                         max_num_batched_tokens=64, cpu_threads=1, device=device, **overrides)


def _rank_main(rank: int, port: int, cases: dict, results, device: str = "cpu") -> None:
    """One rank of the 2-rank job: every case in turn, rank 0 leading as in serving. On CUDA
    (NCCL) the runner captures decode and mixed-step graphs, collectives inside."""
    from backend.distributed.group import Rendezvous, TPGroup
    from backend.model.quantization import quantize_model
    from backend.server.rank_steps import LeaderRunner, follow
    from backend.server.ranks import ServingOptions, build_rank

    try:
        dev = torch.device("cpu") if device == "cpu" else torch.device("cuda", rank)
        group = TPGroup.join(rank, Rendezvous("127.0.0.1", port, 2), dev)
        for name, (path, overrides, fp8) in cases.items():
            if name == "host_tier":
                _host_tier_rank(rank, group, results, path)
                continue
            runner, loaded, _, _ = build_rank(_backend_config(path, overrides, device),
                                              ServingOptions(**GPU_SERVING_KW), group)
            if fp8:  # the FP8 oracle (the kernels need CUDA >= 8.9)
                quantize_model(runner.model, "fp8", check_device=False)
            if rank == 0:
                leader = LeaderRunner(runner, group)
                # a step every rank refuses before its first collective (decodes must come
                # first): refused here, skipped by the follower, and the group carries on
                bad = [Chunk("x", [1, 2], 0, [0]), Chunk("y", [3], 4, [1, 2], is_prefill=False)]
                try:
                    leader.execute(bad)
                    raise AssertionError("a prefill before a decode was accepted")
                except ValueError:
                    pass
                logits = _run(leader, _steps(loaded.config.vocab_size))
                leader.stop()
                results.put((name, [t.cpu().clone() for t in logits]))
            else:
                follow(runner, group)
        group.close()
    except BaseException as exc:
        results.put(("error", f"rank {rank}: {exc!r}"))
        raise


def _tier_config(path: Path, **kw) -> BackendConfig:
    # an HF checkpoint, not the `tiny` preset: its sharper attention makes the greedy tokens
    # depend on the swapped-in K/V (zeroing those blocks changes them; on `tiny` it did not)
    return BackendConfig(model=str(path), block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                         max_model_len=128, cpu_threads=1, **kw)


def _host_tier_rank(rank: int, group, results, path: Path) -> None:
    """The host tier's scenario of tests/test_host_kv_tier.py at TP=2: a pool small enough that
    sequences are swapped out to host memory and come back."""
    from backend.server.rank_steps import follow
    from backend.server.ranks import ServingOptions, build_rank, leader_engine
    from tests.test_host_kv_tier import prompts, serve

    cfg = _tier_config(path, num_blocks=40, host_kv_gib=0.0005)
    runner, loaded, _, host_kv = build_rank(cfg, ServingOptions(), group)
    if rank:
        follow(runner, group, host_kv)
        return
    engine = leader_engine(cfg, runner, loaded, host_kv, group)
    reqs = {f"r{i}": p for i, p in enumerate(prompts([40, 52, 33, 61, 45, 38]))}
    out = serve(engine, reqs)
    engine.runner.stop()
    bm = engine.scheduler.block_manager
    results.put(("host_tier", {"tokens": out, "swaps": engine.scheduler.num_swap_preemptions,
                               "host_hit_tokens": bm.num_host_hit_tokens,
                               "copies": engine.host_kv.num_copies}))


def _tp1_logits(path: Path, overrides: dict, fp8: bool, device: str = "cpu") -> list[torch.Tensor]:
    from backend.engine.assemble import create_engine
    from backend.model.quantization import quantize_model
    from backend.runner.serving import configure_serving

    engine, loaded = create_engine(_backend_config(path, overrides, device))
    if device != "cpu":
        configure_serving(engine.runner, "none", False, (1, 2, 4), token_buckets=(16, 32, 64))
    if fp8:
        quantize_model(engine.runner.model, "fp8", check_device=False)
    return [t.cpu() for t in _run(engine.runner, _steps(loaded.config.vocab_size))]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    with patch.dict(CHECKPOINTS, {"tp_mqa": MQA}):
        return {name: make_checkpoint(root, name)
                for name in ("gqa1_untied_oddvocab", "gqa4_tied_rope4", "tp_mqa")}


def _tp2_job(cases: dict, device: str = "cpu") -> dict:
    """Every case's logits from one 2-process job (rank 0's view)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, store.port, cases, results, device))
             for r in (0, 1)]
    for p in procs:
        p.start()
    out = {}
    try:
        while len(out) < len(cases):
            name, value = results.get(timeout=300)
            assert name != "error", value
            out[name] = value
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return out


@pytest.fixture(scope="module")
def tp2_logits(checkpoints):
    cases = {n: (checkpoints[c], o, q) for n, (c, o, q) in CASES.items()}
    cases["host_tier"] = (checkpoints["gqa1_untied_oddvocab"], {}, False)
    return _tp2_job(cases)


def test_tp2_host_tier_swaps_and_gives_the_unpreempted_greedy_tokens(checkpoints, tp2_logits):
    """Every rank copies its slice of the same blocks (a follower that skipped the copies, or
    zeroed the blocks it brought back, fails this)."""
    from backend.engine.assemble import create_engine
    from tests.test_host_kv_tier import prompts, serve

    engine, _ = create_engine(_tier_config(checkpoints["gqa1_untied_oddvocab"], num_blocks=256))
    reqs = {f"r{i}": p for i, p in enumerate(prompts([40, 52, 33, 61, 45, 38]))}
    want = serve(engine, reqs)
    got = tp2_logits["host_tier"]
    assert got["swaps"] > 0 and got["host_hit_tokens"] > 0 and got["copies"] > 0
    assert got["tokens"] == want


@pytest.mark.parametrize("case", [c for c in CASES if c != "fp8_weights"])
def test_tp2_logits_equal_tp1(case, checkpoints, tp2_logits):
    ckpt, overrides, _ = CASES[case]
    ref = _tp1_logits(checkpoints[ckpt], overrides, False)
    got = tp2_logits[case]
    assert len(got) == len(ref) == 4
    for step, (a, b) in enumerate(zip(got, ref)):
        assert a.shape == b.shape, step  # the full vocabulary, padding cut off
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=f"step {step}")
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_tp2_fp8_weights_are_as_close_to_fp32_as_tp1_fp8(checkpoints, tp2_logits):
    """Per-output-channel scales over a rank's half of a row-parallel layer's inputs are not the
    full row's, so TP=2 FP8 is not bit-equal to TP=1 FP8; it must be as close to the fp32
    logits (a wrong piece or scale would be far off)."""
    ckpt, overrides, _ = CASES["fp8_weights"]
    exact = _tp1_logits(checkpoints[ckpt], overrides, False)
    tp1 = _tp1_logits(checkpoints[ckpt], overrides, True)
    tp2 = tp2_logits["fp8_weights"]
    # the first step only: later steps feed each run's own greedy tokens
    err1 = (tp1[0] - exact[0]).abs().max().item()
    err2 = (tp2[0] - exact[0]).abs().max().item()
    assert 0 < err1 and err2 <= 1.5 * err1, (err1, err2)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_over_nccl_with_cuda_graphs_equals_tp1(checkpoints):
    """Not run yet (no machine with 2 GPUs was lent): NCCL collectives captured in the decode
    and mixed-step graphs give the TP=1 graphs' logits."""
    cases = {n: (checkpoints[CASES[n][0]], CASES[n][1], False)
             for n in ("kv_split_untied_oddvocab", "tied_gqa_rope", "kv_replicated")}
    got = _tp2_job(cases, "cuda")
    for name, (path, overrides, _) in cases.items():
        ref = _tp1_logits(path, overrides, False, "cuda")
        for step, (a, b) in enumerate(zip(got[name], ref)):
            torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=f"{name} step {step}")


# ---- `tidegate backend --tensor-parallel-size 2` ---------------------------------------------

def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _check_greedy(client: DealerClient, path: Path) -> None:
    info = client.hello()
    assert info.vocab_size == 263 and info.num_kv_blocks == 64
    g = torch.Generator().manual_seed(1)
    prompts = {f"r{i}": torch.randint(0, 256, (n,), generator=g).tolist()
               for i, n in enumerate((5, 17, 9))}
    client.batch(prompts, max_tokens=12, temperature=0.0, ignore_eos=True)
    tokens, finals, _ = client.collect(list(prompts))
    assert not client.errors and set(finals) == set(prompts)
    hf = hf_model(path)
    for rid, prompt in prompts.items():
        assert tokens[rid] == hf_greedy(hf, prompt, 12), rid


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_backend_tp2_on_two_gpus_serves_transformers_greedy_tokens(checkpoints, tmp_path):
    """Not run yet (no machine with 2 GPUs was lent)."""
    path = checkpoints["gqa1_untied_oddvocab"]
    w = WorkerProcess(["--model", str(path), "--device", "cuda", "--tensor-parallel-size", "2",
                       "--num-blocks", "64"], f"ipc://{tmp_path}/tp.sock", timeout=300)
    try:
        assert "tensor-parallel 2 (nccl)" in w.ready_line
        client = DealerClient(w.endpoint)
        _check_greedy(client, path)
        client.close()
        assert w.terminate() == 0
    finally:
        w.kill()


def test_backend_tp2_serves_transformers_greedy_tokens_until_a_rank_dies(checkpoints, tmp_path):
    """One backend's life: greedy tokens through the socket equal transformers'; then rank 1 is
    killed mid-request: the request gets an error, the backend exits 1 by itself, no hang."""
    path = checkpoints["gqa1_untied_oddvocab"]
    w = WorkerProcess(["--model", str(path), "--tensor-parallel-size", "2", "--num-blocks", "64",
                       "--cpu-threads", "1"], f"ipc://{tmp_path}/tp.sock")
    try:
        assert "tensor-parallel 2 (gloo)" in w.ready_line
        (rank1,) = _children(w.proc.pid)
        client = DealerClient(w.endpoint)
        _check_greedy(client, path)

        client.batch({"long": [1, 2, 3]}, max_tokens=500, temperature=0.0, ignore_eos=True)
        while True:  # kill rank 1 once the request is streaming
            m = client.recv(30)
            if m.kind == "step_output" and any(o.request_id == "long"
                                               for o in m.envelope.step_output.outputs):
                break
        os.kill(rank1, signal.SIGKILL)
        t0 = time.monotonic()
        tokens, finals, _ = client.collect(["long"], timeout_s=30)
        assert "long" not in finals and len(tokens["long"]) < 500
        (err,) = client.errors
        assert err.request_id == "long"
        # failed mid-step (names the rank) or stopped between steps (SIGTERM's path)
        assert "rank 1" in err.message or "shutting down" in err.message, err.message
        assert w.proc.wait(30) == 1  # stopped by itself, and says it failed
        assert time.monotonic() - t0 < 30
        assert "tensor-parallel rank 1" in w.proc.stderr.read()
        client.close()
    finally:
        w.kill()


def test_an_idle_backend_whose_rank_dies_exits_1(checkpoints, tmp_path):
    """No request in flight: the watchdog alone stops the backend (nothing waits for a step)."""
    path = checkpoints["gqa4_tied_rope4"]
    w = WorkerProcess(["--model", str(path), "--tensor-parallel-size", "2", "--num-blocks", "64",
                       "--cpu-threads", "1"], f"ipc://{tmp_path}/tp.sock")
    try:
        (rank1,) = _children(w.proc.pid)
        os.kill(rank1, signal.SIGKILL)
        assert w.proc.wait(30) == 1
        assert f"tensor-parallel rank 1 (pid {rank1}) exited" in w.proc.stderr.read()
    finally:
        w.kill()


def test_the_other_ranks_exit_when_rank_0_is_killed(checkpoints, tmp_path):
    """No orphans: SIGKILL of the backend (rank 0) leaves no follower running."""
    path = checkpoints["gqa4_tied_rope4"]
    w = WorkerProcess(["--model", str(path), "--tensor-parallel-size", "2", "--num-blocks", "64",
                       "--cpu-threads", "1"], f"ipc://{tmp_path}/tp.sock")
    try:
        (rank1,) = _children(w.proc.pid)
        w.proc.kill()
        w.proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:  # reaped by init, or a zombie: gone either way
                with open(f"/proc/{rank1}/stat") as f:
                    if f.read().split(")")[-1].split()[0] == "Z":
                        break
            except FileNotFoundError:
                break
            time.sleep(0.1)
        assert time.monotonic() < deadline, "rank 1 outlived rank 0"
    finally:
        w.kill()


def test_a_model_the_size_does_not_split_fails_start_up_cleanly(tmp_path):
    path = make_checkpoint(tmp_path, "gqa7_sharded")  # 7 heads
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "gateway.tidegate_cli", "backend", "--listen",
                        f"ipc://{tmp_path}/x.sock", "--model", str(path),
                        "--tensor-parallel-size", "2"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 1
    assert "does not divide the 7 attention heads" in r.stderr
