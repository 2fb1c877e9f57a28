"""Engine end to end in-process (the worker-socket versions are in test_backend_worker.py)."""
import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams
from tests.backend_helpers import hf_greedy, hf_model, make_checkpoint

NUM_NEW = 32


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("engine"), "gqa4_tied_rope4")
    return path, hf_model(path)


def prompts(vocab, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def run_all(engine, reqs, params, check=True):
    """Serve `reqs` together; returns id -> generated tokens. Checks integrity every step."""
    for rid, prompt in reqs.items():
        assert engine.add_request(rid, prompt, params) is None
    out = {rid: [] for rid in reqs}
    finished = {}
    steps = 0
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
            if o.finish_reason:
                finished[o.request_id] = o
        if check:
            engine.check_integrity()
        steps += 1
        assert steps < 10_000
    assert set(finished) == set(reqs)
    return out, finished


GREEDY = SamplingParams(max_tokens=NUM_NEW, ignore_eos=True)


def test_greedy_matches_transformers_with_chunked_prefill(ckpt):
    path, hf = ckpt
    engine, loaded = create_engine(BackendConfig(model=str(path), block_size=4, num_blocks=256,
                                                 max_num_seqs=8, max_num_batched_tokens=24))
    reqs = dict(zip("abcd", prompts(loaded.config.vocab_size, [5, 40, 17, 61])))
    out, fin = run_all(engine, reqs, GREEDY)
    for rid, prompt in reqs.items():
        assert out[rid] == hf_greedy(hf, prompt, NUM_NEW), rid
        assert fin[rid].finish_reason == "length" and fin[rid].num_completion_tokens == NUM_NEW


def test_prefix_cache_hits_and_preemption(ckpt):
    path, hf = ckpt
    vocab = hf.config.vocab_size
    shared = prompts(vocab, [24], seed=5)[0]
    tails = prompts(vocab, [3, 9, 1, 14], seed=6)
    reqs = {f"p{i}": shared + t for i, t in enumerate(tails)}
    # 14 blocks of 4 tokens: four sequences of ~60 tokens cannot all stay resident
    engine, _ = create_engine(BackendConfig(model=str(path), block_size=4, num_blocks=40,
                                            max_num_seqs=4, max_num_batched_tokens=64,
                                            max_model_len=128))
    out, fin = run_all(engine, reqs, GREEDY)
    stats = engine.scheduler.stats()
    assert stats.num_preemptions > 0
    assert stats.num_prefix_hit_tokens > 0 and max(f.num_cached_tokens for f in fin.values()) >= 20
    for rid, prompt in reqs.items():
        assert out[rid] == hf_greedy(hf, prompt, NUM_NEW), rid
    engine.check_integrity()
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_seeded_sampling_reproducible_and_stop_tokens(ckpt):
    path, _ = ckpt
    engine, loaded = create_engine(BackendConfig(model=str(path), block_size=4, num_blocks=128,
                                                 max_num_seqs=4, max_num_batched_tokens=32))
    ps = prompts(loaded.config.vocab_size, [7, 12, 20], seed=9)
    params = SamplingParams(max_tokens=24, temperature=1.5, top_p=0.95, top_k=50, seed=1234,
                            ignore_eos=True)
    first, _ = run_all(engine, {"a": ps[0], "b": ps[1], "c": ps[2]}, params)
    # same requests, another batch composition and order
    second, _ = run_all(engine, {"c2": ps[2], "a2": ps[0]}, params)
    assert first["a"] == second["a2"] and first["c"] == second["c2"]
    assert len(set(first["a"])) > 5  # actually sampled, not greedy
    other, _ = run_all(engine, {"a3": ps[0]}, SamplingParams(**{**params.__dict__, "seed": 99}))
    assert other["a3"] != first["a"]
    # stop token: finish as soon as it is sampled
    stop_at = first["a"][5]
    k = first["a"].index(stop_at)
    out, fin = run_all(engine, {"s": ps[0]},
                       SamplingParams(**{**params.__dict__, "stop_token_ids": (stop_at,)}))
    assert out["s"] == first["a"][:k + 1] and fin["s"].finish_reason == "stop"


def test_abort_frees_blocks_and_bad_requests_refused(ckpt):
    path, _ = ckpt
    engine, _ = create_engine(BackendConfig(model=str(path), block_size=4, num_blocks=64,
                                            max_num_seqs=4, max_num_batched_tokens=32,
                                            max_model_len=64))
    assert engine.add_request("x", [1, 2, 3], GREEDY) is None
    engine.step()
    rec = engine.abort("x")
    assert rec.finish_reason == "abort" and rec.num_completion_tokens == 1
    assert engine.abort("x") is None
    assert not engine.has_unfinished()
    engine.check_integrity()
    assert "exceeds max_model_len" in engine.add_request("y", [1] * 40, GREEDY)
    assert "outside" in engine.add_request("z", [10_000], GREEDY)
    assert engine.add_request("w", [], GREEDY) == "empty prompt"
