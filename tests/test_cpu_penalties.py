"""The CPU penalties kernel (issue 32: 29 ms of a 200-row decode step in torch) against the torch
version on a random batch, histories with repeats and pads, and the caller's logits untouched."""
import pytest
import torch

from backend.kernels.cpu import load_library
from backend.runner.sampler import _flat_ids, apply_penalties, apply_penalties_cpu

pytestmark = pytest.mark.skipif(load_library() is None, reason="no C compiler for the CPU kernels")


def test_kernel_matches_the_torch_penalties():
    g = torch.Generator().manual_seed(0)
    rows, vocab = 9, 300
    logits = torch.randn(rows, vocab, generator=g) * 4
    prompts = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in (0, 1, 5, 40, 3, 7, 0, 12, 2)]
    outputs = [torch.randint(0, 20, (int(n),), generator=g).tolist() for n in (0, 6, 0, 30, 2, 9, 4, 1, 25)]
    rep = torch.tensor([1.0, 1.3, 0.7, 2.0, 1.1, 1.0, 0.5, 1.2, 3.0])
    pres = torch.tensor([0.0, 0.5, -1.0, 0.2, 0.0, 1.0, 0.3, 0.0, -0.4])
    freq = torch.tensor([0.0, 0.25, 1.5, -0.5, 0.2, 0.0, 0.1, 0.7, 0.05])

    def padded(rs):
        width = max(1, max(len(r) for r in rs))
        return torch.tensor([r + [vocab] * (width - len(r)) for r in rs])

    want = apply_penalties(logits, padded(prompts), padded(outputs), rep, pres, freq)
    before = logits.clone()
    got = apply_penalties_cpu(logits, (_flat_ids(prompts), _flat_ids(outputs)), rep, pres, freq)
    assert torch.equal(logits, before)  # a new tensor: the logprobs read the model's logits
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.equal(got, logits)
