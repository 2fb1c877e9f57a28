import math

import torch

from backend.runner.sampler import (
    Sampler,
    SamplingParams,
    SamplingTensors,
    finish_reason,
    sample,
    uniform_noise,
)


def _tensors(n, vocab, **kw):
    p = SamplingParams(**kw)
    return SamplingTensors.build([p] * n, list(range(n)), [0] * n, vocab, torch.device("cpu"))


def test_noise_is_uniform_and_a_pure_function():
    seeds = torch.tensor([1, 2, 2**40 + 1, 1], dtype=torch.int64)
    counters = torch.tensor([0, 0, 0, 1], dtype=torch.int64)
    u = uniform_noise(seeds, counters, 50_000)
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[3]) and not torch.equal(u[1], u[2])
    assert torch.equal(u, uniform_noise(seeds, counters, 50_000))


def test_temperature_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    n = 20_000
    logits = probs.log().repeat(n, 1)
    ids = sample(logits, _tensors(n, 4, temperature=1.0))
    freq = torch.bincount(ids, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.015), freq


def test_top_k_and_top_p_restrict_the_support():
    n = 4000
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0]).repeat(n, 1)
    ids = sample(logits, _tensors(n, 5, temperature=2.0, top_k=2))
    assert set(ids.tolist()) == {0, 1}
    # softmax([3,2,1,0,-1]) = .636 .234 .086 .032 .012: top_p=0.8 keeps {0, 1}; 0.9 keeps {0,1,2}
    ids = sample(logits, _tensors(n, 5, temperature=1.0, top_p=0.8))
    assert set(ids.tolist()) == {0, 1}
    ids = sample(logits, _tensors(n, 5, temperature=1.0, top_p=0.9))
    assert set(ids.tolist()) == {0, 1, 2}
    ids = sample(logits, _tensors(n, 5, temperature=1.0, top_p=0.01))  # keeps the best token
    assert set(ids.tolist()) == {0}


def test_greedy_rows_mixed_with_sampled_rows_and_seed_independent_of_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 300)
    s = Sampler(300, "cpu")
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=7, top_k=50),
              SamplingParams(temperature=1.3, top_p=0.9, seed=8)] * 2
    ids, _ = s(logits, params, [0, 7, 8, 0, 7, 8], [0, 5, 5, 0, 5, 5])
    assert ids[0] == logits[0].argmax().item() and ids[3] == logits[3].argmax().item()
    # the same request alone in a batch draws the same token
    alone, _ = s(logits[1:2], params[1:2], [7], [5])
    assert alone[0] == ids[1]
    again, _ = s(logits, params, [0, 7, 8, 0, 7, 8], [0, 5, 5, 0, 5, 5])
    assert again == ids


def test_logprobs():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 5.0]])
    s = Sampler(4, "cpu")
    ids, lps = s(logits, [SamplingParams(logprobs=2), SamplingParams()], [0, 0], [0, 0])
    assert ids == [0, 3] and lps[1] is None
    ref = torch.log_softmax(logits[0], -1)
    assert math.isclose(lps[0].logprob, ref[0].item(), rel_tol=1e-6)
    assert lps[0].top_ids == [0, 1]
    assert math.isclose(lps[0].top_logprobs[1], ref[1].item(), rel_tol=1e-6)


def test_finish_reason():
    p = SamplingParams(max_tokens=3, stop_token_ids=(9,))
    assert finish_reason(9, 1, p, (2,), 10, 100) == "stop"
    assert finish_reason(2, 1, p, (2,), 10, 100) == "stop"
    assert finish_reason(2, 1, SamplingParams(max_tokens=3, ignore_eos=True), (2,), 10, 100) is None
    assert finish_reason(5, 3, p, (2,), 10, 100) == "length"
    assert finish_reason(5, 1, p, (2,), 100, 100) == "length"
    assert finish_reason(5, 1, p, (2,), 10, 100) is None
