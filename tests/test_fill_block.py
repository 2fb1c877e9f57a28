"""int4-fp8 keeps the block being filled at full precision (backend.kv.fill_slots): which rows a
sequence's last block lives in, and that a served decode reads exactly what the sinks
experiment measured (evals/kv_sinks.py, `int4+fill`)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.kernels.reference.attention import TorchAttention
from backend.kv.fill_slots import FillSlots
from backend.kv.pools import FILL_BLOCK_ENV
from backend.runner.cuda_graphs import StepGraphs
from backend.runner.sampler import SamplingParams
from evals.engine import sequence_logits

# ---- the slot rules ------------------------------------------------------------------------------

def test_a_continuing_sequence_keeps_its_slot_and_reads_its_last_block():
    fs = FillSlots(3, block_size=4)
    fs.begin_step()
    slot, lo = fs.assign("a", 0, 6)            # a 6-token prompt: block 1 (4, 5) is the last
    assert lo == 4
    assert fs.rows(slot, lo, 0, 6).tolist() == [-1, -1, -1, -1, slot * 4, slot * 4 + 1]
    fs.begin_step()
    assert fs.assign("a", 6, 1) == (slot, 4)   # decode at 6: positions 4..6 from the slot
    fs.begin_step()
    assert fs.assign("a", 7, 1) == (slot, 4)
    fs.begin_step()
    assert fs.assign("a", 8, 1) == (slot, 8)   # a new block: its first row is rewritten
    assert fs.rows(slot, 8, 8, 1).tolist() == [slot * 4]


def test_a_restart_or_a_late_start_reads_nothing_it_did_not_write():
    fs = FillSlots(3, block_size=4)
    fs.begin_step()
    slot, _ = fs.assign("a", 0, 6)
    fs.begin_step()
    assert fs.assign("a", 6, 4) == (slot, 8)   # into block 2: the slot now holds 8, 9
    fs.begin_step()
    # recomputed from position 5 (block 1, not the block last written): the slot's rows hold
    # block 2's keys, so 4 is read from the codes
    assert fs.assign("a", 5, 2) == (slot, 5)
    fs.begin_step()
    assert fs.assign("a", 7, 1) == (slot, 5)
    fs.begin_step()
    # a step back inside the block last written (a verify's rejected drafts given back,
    # issue 28) keeps the rows: 4..6 were written by this sequence into this slot
    assert fs.assign("a", 8, 2) == (slot, 8)
    fs.begin_step()
    assert fs.assign("a", 9, 1) == (slot, 8)
    fs.begin_step()
    # a new request whose first chunk starts mid-block (prefix-cache hit, or a swap-in)
    b_slot, lo = fs.assign("b", 9, 1)
    assert b_slot != slot and lo == 9


def test_the_least_recently_used_slot_is_taken_and_its_owner_starts_over():
    fs = FillSlots(2, block_size=4)
    fs.begin_step()
    sa, _ = fs.assign("a", 0, 3)
    fs.begin_step()
    sb, _ = fs.assign("b", 0, 3)
    assert sb != sa
    fs.begin_step()
    fs.assign("b", 3, 1)
    sc, _ = fs.assign("c", 0, 2)               # "a" (finished, or waiting) loses its slot
    assert sc == sa
    fs.begin_step()
    fs.assign("c", 2, 1)
    sa2, lo = fs.assign("a", 3, 1)             # "a" comes back: new slot, nothing before 3
    assert sa2 == sb and lo == 3
    fs.begin_step()
    fs.assign("x", 0, 1)
    fs.assign("y", 0, 1)
    with pytest.raises(RuntimeError, match="fill slots"):
        fs.assign("z", 0, 1)                   # more sequences in a step than slots


# ---- served decodes read what the experiment measured ----------------------------------------------

def _engine(monkeypatch, fill: bool, graphs: bool = True, num_blocks: int = 64,
            max_num_seqs: int = 1, budget: int = 4, prefix_caching: bool = False):
    monkeypatch.setenv(FILL_BLOCK_ENV, "1" if fill else "0")
    engine, _ = create_engine(BackendConfig(
        model="tiny", kv_cache_dtype="int4-fp8", num_blocks=num_blocks, block_size=4,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=128,
        enable_prefix_caching=prefix_caching))
    engine.runner.model.attn = TorchAttention(engine.runner.model.config.head_dim ** -0.5)
    if graphs:  # the CPU stand-in of the CUDA graphs: decode steps take the packed fill columns
        engine.runner.graphs = StepGraphs(engine.runner, (1, 2, 4), use_cuda_graphs=False,
                                          token_buckets=(4,))
    return engine


def _generate(engine, prompt, n):
    assert engine.add_request("r", prompt, SamplingParams(max_tokens=n, ignore_eos=True,
                                                          logprobs=1)) is None
    tokens, logprobs = [], []
    while engine.has_unfinished():
        for o in engine.step():
            tokens += o.new_token_ids
            logprobs += [lp.logprob for lp in o.logprobs]
    return tokens, logprobs


def _teacher_forced(engine, tokens, first):
    """log p(tokens[i]) for i >= first, scored in one-block chunks."""
    logits = sequence_logits(engine, tokens[:-1])
    lp = torch.log_softmax(logits.float(), dim=-1)
    return [lp[i - 1, tokens[i]].item() for i in range(first, len(tokens))]


def _experiment():
    return importlib.import_module("evals.kv_sinks")


def test_served_decodes_read_the_last_block_at_full_precision(monkeypatch):
    """Greedy decode through the runner (decode-graph stand-in) with fill rows gives, token for
    token, the log-probabilities of teacher-forced scoring whose current block is read at full
    precision (the experiment's wrapper, one-block chunks); without fill rows it gives plain
    int4-fp8's, and the two differ."""
    prompt = list(range(3, 11))                 # 8 tokens: two whole one-block chunks
    served, lp_fill = _generate(_engine(monkeypatch, fill=True), prompt, 18)
    seq = prompt + served

    ref = _engine(monkeypatch, fill=False, graphs=False)
    kv = ref.runner.kv
    kv.k_caches = [_experiment().ShadowedKeyPages(c, 0, True) for c in kv.k_caches]
    want = _teacher_forced(ref, seq, len(prompt))
    assert np.allclose(lp_fill, want, atol=2e-4), np.abs(np.array(lp_fill) - want).max()

    served_plain, lp_plain = _generate(_engine(monkeypatch, fill=False), prompt, 18)
    plain_ref = _teacher_forced(_engine(monkeypatch, fill=False, graphs=False),
                                prompt + served_plain, len(prompt))
    assert np.allclose(lp_plain, plain_ref, atol=2e-4)
    assert served_plain != served or np.abs(np.array(lp_plain) - lp_fill).max() > 1e-3


def _serve_mix(monkeypatch, graphs: bool, num_blocks: int):
    """Eight requests arriving over the steps with prefix caching on: every other one shares an
    8-token prefix, two are that prefix alone (a whole-prompt hit: their first chunk starts at
    7, inside a block), in a pool of `num_blocks`. -> (tokens, logprobs, preemptions)."""
    engine = _engine(monkeypatch, fill=True, graphs=graphs, num_blocks=num_blocks,
                     max_num_seqs=4, budget=16, prefix_caching=True)
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 200, (8,), generator=g).tolist()
    pending = []
    for i, n in enumerate((5, 11, 3, 9, 6, 7, 2, 10)):
        own = torch.randint(0, 200, (n,), generator=g).tolist()
        prompt = shared if i in (2, 6) else shared + own if i % 2 else own
        pending.append((f"r{i}", prompt, SamplingParams(max_tokens=12 + 2 * (i % 4),
                                                        ignore_eos=True, logprobs=1)))
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}
    num_steps = 0
    while pending or engine.has_unfinished():
        if pending and num_steps % 3 == 0:
            rid, prompt, params = pending.pop(0)
            assert engine.add_request(rid, prompt, params) is None
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            logprobs.setdefault(o.request_id, []).extend(lp.logprob for lp in o.logprobs)
        num_steps += 1
    engine.check_integrity()
    assert engine.scheduler.block_manager.num_free_blocks == num_blocks  # every block back
    return tokens, logprobs, engine.scheduler.num_preemptions


def test_graph_steps_equal_eager_steps_with_fill_rows_under_preemption(monkeypatch):
    """Requests in a pool too small for all of them (preempted, recomputed from their cached
    prefix), prefix caching on, decode and mixed graph stand-ins: the same greedy tokens as
    eager steps, and as the same requests served without a preemption (a pool that holds them
    all). A recomputed sequence reads its earlier keys from the codes as the unpreempted one
    did, and its block being filled from the rows its recompute wrote, so its log-probabilities
    stay within the recompute's own rounding of the unpreempted ones (issue 27: the test compared
    two preempted runs with prefix caching off)."""
    unpreempted = _serve_mix(monkeypatch, graphs=True, num_blocks=200)
    assert unpreempted[2] == 0
    for num_blocks in (12, 14):
        graphs = _serve_mix(monkeypatch, graphs=True, num_blocks=num_blocks)
        assert graphs[2] >= 3, num_blocks  # preempted, several times
        assert graphs[0] == _serve_mix(monkeypatch, graphs=False, num_blocks=num_blocks)[0]
        assert graphs[0] == unpreempted[0], num_blocks
        for rid, want in unpreempted[1].items():
            assert np.allclose(graphs[1][rid], want, atol=1e-2), (num_blocks, rid)
