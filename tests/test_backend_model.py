"""Our model against transformers' on random checkpoints (CPU, float32)."""
import pytest
import torch

from backend.kv.pools import KVCache
from backend.model.loader import load
from backend.runner.step import ModelRunner
from tests.backend_helpers import CHECKPOINTS, BlockAllocator, Chunk, hf_model, make_checkpoint

BLOCK = 4  # small blocks: contexts cross many block boundaries


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def ckpt(request, tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("ckpt"), request.param)
    loaded = load(str(path))
    kv = KVCache.allocate(loaded.config, 64, BLOCK, torch.float32, "cpu")
    runner = ModelRunner(loaded.model, kv, max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256)
    return path, loaded, runner, hf_model(path)


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _prompt(n, seed, vocab):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def test_logits_match_transformers(ckpt):
    _path, loaded, runner, hf = ckpt
    ids = _prompt(45, 1, loaded.config.vocab_size)
    alloc = BlockAllocator(BLOCK)
    n, ctx, _ = runner.prepare([Chunk("a", ids, 0, alloc.table("a", len(ids)))])
    ours = loaded.model.compute_logits(loaded.model(runner.buffers.input_ids[:n],
                                                    runner.buffers.positions[:n], ctx, runner.kv))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert ref.abs().max() > 0.5  # weights large enough that attention is not uniform
    assert _rel(ours, ref) < 1e-4


def test_packed_prefills_chunked_prefill_and_decodes_match_one_shot(ckpt):
    """A step holding decodes and several packed prefill chunks gives the logits that a
    one-shot forward of each full sequence gives at the same positions (also: chunked == one-shot)."""
    _path, loaded, runner, hf = ckpt
    vocab = loaded.config.vocab_size
    prompts = {"a": _prompt(30, 2, vocab), "b": _prompt(11, 3, vocab), "c": _prompt(23, 4, vocab)}
    with torch.no_grad():
        ref = {k: hf(torch.tensor([v])).logits[0] for k, v in prompts.items()}
    alloc = BlockAllocator(BLOCK)
    # step 1: a[0:13], b[0:10] (not sampling), c[0:23]
    steps = [
        [Chunk("a", prompts["a"][:13], 0, alloc.table("a", 13), sample=False),
         Chunk("b", prompts["b"][:10], 0, alloc.table("b", 10)),
         Chunk("c", prompts["c"], 0, alloc.table("c", 23))],
        # step 2: c and b decode (feeding their next prompt-known tokens), a continues in two chunks
        [Chunk("b", prompts["b"][10:11], 10, alloc.table("b", 11), is_prefill=False),
         Chunk("a", prompts["a"][13:29], 13, alloc.table("a", 29))],
        [Chunk("a", prompts["a"][29:30], 29, alloc.table("a", 30), is_prefill=False)],
    ]
    expect = [{"b": ref["b"][9], "c": ref["c"][22]}, {"b": ref["b"][10], "a": ref["a"][28]},
              {"a": ref["a"][29]}]
    for chunks, exp in zip(steps, expect):
        out = runner.execute(chunks, keep_logits=True)
        sampled = [c.request_id for c in chunks if c.sample]
        assert sorted(sampled) == sorted(exp)
        for row, rid in enumerate(sampled):
            assert _rel(out.logits[row], exp[rid]) < 1e-4, rid
            assert out.token_ids[rid] == int(exp[rid].argmax())
