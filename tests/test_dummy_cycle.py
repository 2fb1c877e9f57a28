"""`--load-format dummy-cycle` (issue 28's oracle): random weights whose greedy output walks a fixed
cycle through the vocabulary whatever the summation order — float32 and bfloat16, plain decoding
and verify steps with a prediction — so that a prediction built from one greedy run is exact in
the next, which random weights (near-tied logits) do not give in bf16."""
from __future__ import annotations

import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.errors import ModelLoadError
from backend.model.loader import cycle_order, load
from backend.runner.cuda_graphs import StepGraphs
from backend.runner.sampler import SamplingParams
from scheduler.speculation import SpeculationConfig, Speculator, StepCostModel
from tests.backend_helpers import make_checkpoint


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"), "gqa7_sharded")


def _walk(start: int, n: int, vocab: int, seed: int = 0) -> list[int]:
    order = cycle_order(vocab, seed)
    nxt = {order[j]: order[(j + 1) % vocab] for j in range(vocab)}
    out, t = [], start
    for _ in range(n):
        t = nxt[t]
        out.append(t)
    return out


def _serve(path, dtype, prompts, n, predictions=None, graphs=False):
    engine, _ = create_engine(BackendConfig(model=str(path), load_format="dummy-cycle",
                                            dtype=dtype, num_blocks=128, block_size=4,
                                            max_num_seqs=8, max_num_batched_tokens=64,
                                            max_model_len=256))
    if graphs:  # the CPU stand-in of the graph steps: decode buckets and mixed token buckets
        engine.runner.graphs = StepGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False,
                                          token_buckets=(8, 16, 32, 64))
    if predictions is not None:
        engine.speculator = Speculator(SpeculationConfig(), StepCostModel())
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    for i, p in enumerate(prompts):
        pred = predictions[i] if predictions is not None else None
        assert engine.add_request(str(i), p, params, prediction=pred) is None
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    assert engine.scheduler.block_manager.num_used_blocks == 0
    return [out[str(i)] for i in range(len(prompts))], engine


PROMPTS = [[5, 9, 200, 17, 3, 44], [100, 101, 102, 103, 104, 105, 106, 107, 108, 77], [250]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_output_walks_the_cycle(untied, dtype):
    outs, engine = _serve(untied, dtype, PROMPTS, 40)
    vocab = engine.runner.model.config.vocab_size
    for p, got in zip(PROMPTS, outs):
        assert got == _walk(p[-1], 40, vocab), f"{dtype}: the output left the cycle"


def test_prediction_with_altered_tokens_keeps_the_output_in_bf16(untied):
    """The oracle's use: predictions = the greedy output with a stretch altered; the output with
    speculation (verify steps, graph stand-in) is the same walk, and drafts were accepted."""
    base, engine = _serve(untied, "bfloat16", PROMPTS, 48)
    vocab = engine.runner.model.config.vocab_size
    preds = []
    for ids in base:
        pred = list(ids)
        for j in range(12, 24):  # one altered "line"
            pred[j] = (pred[j] + 1) % vocab
        preds.append(pred)
    outs, engine = _serve(untied, "bfloat16", PROMPTS, 48, predictions=preds, graphs=True)
    assert outs == base
    # the unchanged stretches were drafted from the prediction and accepted
    assert engine.speculator.num_accepted["prediction"] >= len(PROMPTS) * 20


def test_random_dummy_is_not_the_cycle(untied):
    """The control: plain `dummy` weights do not walk the cycle (so the test above can fail)."""
    engine, _ = create_engine(BackendConfig(model=str(untied), load_format="dummy",
                                            num_blocks=64, block_size=4, max_model_len=256))
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    engine.add_request("a", PROMPTS[0], params)
    got = []
    while engine.has_unfinished():
        for o in engine.step():
            got.extend(o.new_token_ids)
    assert got != _walk(PROMPTS[0][-1], 20, engine.runner.model.config.vocab_size)


def test_margin_and_tied_model_refused(untied):
    loaded = load(str(untied), "dummy-cycle", "float32", "cpu", 0)
    net = loaded.model
    order = cycle_order(net.config.vocab_size, 0)
    # the LM head's row next(v) is v's embedding
    w, e = net.lm_head.weight, net.embed_tokens.weight
    assert torch.equal(w[order[1]], e[order[0]]) and torch.equal(w[order[0]], e[order[-1]])
    assert net.layers[0].self_attn.o_proj.weight.abs().max() < 1e-3
    with pytest.raises(ModelLoadError, match="ties"):
        load("tiny", "dummy-cycle", "float32", "cpu", 0)
