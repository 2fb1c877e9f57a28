"""The logit processors (bias, min_tokens bans, penalties, min_p) against a plain reference:
one row at a time, one vocabulary entry at a time, written straight from the definitions."""
import math

import pytest
import torch

from backend.runner.sampler import (
    Sampler,
    SampleSpec,
    SamplingParams,
    SamplingTensors,
    process_logits,
    sample,
)

V = 37


def reference_process(logits: list[float], p: SamplingParams, prompt: list[int],
                      output: list[int], banned: list[int]) -> list[float]:
    out = list(logits)
    for i, b in p.logit_bias:
        out[i] += b
    for i in banned:
        out[i] = -math.inf
    for v in range(len(out)):
        n = output.count(v)
        if v in prompt or n:
            out[v] = out[v] / p.repetition_penalty if out[v] > 0 else out[v] * p.repetition_penalty
        out[v] -= p.frequency_penalty * n + (p.presence_penalty if n else 0.0)
    return out


def reference_min_p_support(logits: list[float], temperature: float, min_p: float) -> set[int]:
    z = [x / temperature for x in logits]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = sum(e)
    probs = [x / s for x in e]
    top = max(probs)
    return {i for i, q in enumerate(probs) if q >= min_p * top}


def _random_case(gen: torch.Generator, i: int):
    prompt = torch.randint(0, V, (int(torch.randint(1, 12, (1,), generator=gen)),),
                           generator=gen).tolist()
    output = torch.randint(0, V, (int(torch.randint(0, 20, (1,), generator=gen)),),
                           generator=gen).tolist()
    bias = tuple((int(t), float(b)) for t, b in zip(
        torch.randperm(V, generator=gen)[:i % 4].tolist(),
        (torch.rand(i % 4, generator=gen) * 20 - 10).tolist()))
    banned = torch.randperm(V, generator=gen)[:i % 3].tolist()
    params = SamplingParams(
        repetition_penalty=[1.0, 1.3, 0.7, 2.0][i % 4],
        presence_penalty=[0.0, 0.5, -1.0][i % 3],
        frequency_penalty=[0.0, 0.25, 1.5, -0.5][(i // 2) % 4],
        logit_bias=bias)
    return params, prompt, output, banned


def test_processors_match_the_reference_on_a_mixed_batch():
    gen = torch.Generator().manual_seed(0)
    rows = [_random_case(gen, i) for i in range(24)]
    logits = torch.randn(len(rows), V, generator=gen) * 3
    specs = [SampleSpec(p, 0, len(out), prompt, out, banned) for p, prompt, out, banned in rows]
    t = SamplingTensors.build([s.params for s in specs], [0] * len(rows), [0] * len(rows), V,
                              torch.device("cpu"), specs)
    got = process_logits(logits, t)
    for r, (p, prompt, out, banned) in enumerate(rows):
        want = reference_process(logits[r].tolist(), p, prompt, out, banned)
        for v in range(V):
            if math.isinf(want[v]):
                assert math.isinf(got[r, v].item()) and got[r, v] < 0
            else:
                assert got[r, v].item() == pytest.approx(want[v], rel=1e-5, abs=1e-5), (r, v)


def test_greedy_rows_take_the_argmax_of_the_processed_logits():
    gen = torch.Generator().manual_seed(1)
    rows = [_random_case(gen, i) for i in range(16)]
    logits = torch.randn(len(rows), V, generator=gen) * 3
    specs = [SampleSpec(p, 0, 0, prompt, out, banned) for p, prompt, out, banned in rows]
    ids, _ = Sampler(V, "cpu").sample_specs(logits, specs)
    for r, (p, prompt, out, banned) in enumerate(rows):
        want = reference_process(logits[r].tolist(), p, prompt, out, banned)
        assert ids[r] == max(range(V), key=lambda v: want[v])


def test_repetition_penalty_changes_a_greedy_choice():
    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    s = Sampler(4, "cpu")
    plain, _ = s.sample_specs(logits, [SampleSpec(SamplingParams(), 0, 0, [0], [0])])
    penalized, _ = s.sample_specs(logits, [SampleSpec(SamplingParams(repetition_penalty=1.2),
                                                      0, 0, [0], [])])
    assert plain == [0] and penalized == [1]  # 2.0 / 1.2 < 1.9


def test_logit_bias_forces_and_bans():
    logits = torch.zeros(2, 5)
    logits[:, 0] = 4.0
    s = Sampler(5, "cpu")
    p_force = SamplingParams(temperature=1.0, logit_bias=((3, 100.0),))
    p_ban = SamplingParams(temperature=1.0, logit_bias=((0, -100.0),))
    for c in range(50):
        ids, _ = s.sample_specs(logits, [SampleSpec(p_force, 1, c), SampleSpec(p_ban, 2, c)])
        assert ids[0] == 3 and ids[1] != 0


def test_min_p_support_matches_the_reference_and_the_sampled_frequencies():
    logits_row = [3.0, 2.5, 1.0, 0.0, -2.0, -4.0]
    for min_p, temp in [(0.1, 1.0), (0.3, 1.0), (0.1, 2.0), (0.9, 0.7), (0.0, 1.0)]:
        n = 3000
        logits = torch.tensor(logits_row).repeat(n, 1)
        p = SamplingParams(temperature=temp, min_p=min_p)
        t = SamplingTensors.build([p] * n, list(range(n)), [0] * n, 6, torch.device("cpu"))
        got = set(sample(logits, t).tolist())
        support = reference_min_p_support(logits_row, temp, min_p)
        assert got == support, (min_p, temp)


def test_presence_and_frequency_penalties_shift_the_distribution_as_defined():
    # two equal tokens; token 0 appeared 3 times in the output: p0/p1 = exp(-(pres + 3 freq))
    logits = torch.zeros(20_000, 2)
    p = SamplingParams(temperature=1.0, presence_penalty=0.2, frequency_penalty=0.1)
    specs = [SampleSpec(p, i, 0, [1], [0, 0, 0]) for i in range(20_000)]
    ids, _ = Sampler(2, "cpu").sample_specs(logits, specs)
    share0 = ids.count(0) / len(ids)
    want = math.exp(-0.5) / (1 + math.exp(-0.5))
    assert abs(share0 - want) < 0.015


def test_banned_ids_never_sampled_and_rows_without_history_unchanged():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(8, V, generator=gen)
    p = SamplingParams(temperature=1.5)
    specs = [SampleSpec(p, 9, c, banned_ids=[int(logits[0].argmax())]) for c in range(4)] + \
        [SampleSpec(p, 9, c) for c in range(4)]
    ids, _ = Sampler(V, "cpu").sample_specs(logits[[0] * 8], specs)
    assert int(logits[0].argmax()) not in ids[:4]
    # a row with no processors draws exactly what the plain path draws
    plain, _ = Sampler(V, "cpu")(logits[[0] * 4], [p] * 4, [9] * 4, list(range(4)))
    assert ids[4:] == plain


def test_logprobs_stay_those_of_the_model():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    p = SamplingParams(logprobs=1, logit_bias=((0, 10.0),))
    ids, lps = Sampler(3, "cpu").sample_specs(logits, [SampleSpec(p, 0, 0)])
    assert ids == [0]
    assert lps[0].logprob == pytest.approx(torch.log_softmax(logits[0], -1)[0].item())


@pytest.mark.gpu
def test_processors_on_cuda_equal_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    gen = torch.Generator().manual_seed(3)
    rows = [_random_case(gen, i) for i in range(32)]
    logits = torch.randn(len(rows), V, generator=gen) * 3
    specs = [SampleSpec(SamplingParams(**{**p.__dict__, "temperature": 0.8, "min_p": 0.05}),
                        i, 3, prompt, out, banned) for i, (p, prompt, out, banned) in enumerate(rows)]
    cpu, _ = Sampler(V, "cpu").sample_specs(logits, specs)
    cuda, _ = Sampler(V, "cuda").sample_specs(logits.cuda(), specs)
    assert cpu == cuda
