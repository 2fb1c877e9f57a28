"""Structured output in the engine: the bitmask against a per-token reference, rows without a
grammar untouched, the sampler's zero-noise guard, and tiny-coder's output held to JSON schemas,
a regex and a choice list with greedy and sampled decoding (checked by `jsonschema`)."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch

import backend.runner.sampler as sampler_mod
from backend.runner.grammar import apply_token_bitmask, bitmask_width, spec_from_wire
from backend.runner.sampler import SampleSpec, SamplingParams, SamplingTensors, sample
from bench.structured.schema_gen import random_schema
from proto import tidegate_pb2 as pb
from tokenizer.grammar import GrammarSpec

TINY_CODER = Path(__file__).resolve().parents[1] / "models" / "tiny-coder"


def _reference_mask(logits: torch.Tensor, rows: list[int], bitmask: np.ndarray) -> torch.Tensor:
    out = logits.clone()
    for g, r in enumerate(rows):
        for tok in range(logits.shape[1]):
            word = int(bitmask[g, tok // 32]) & 0xFFFFFFFF
            if not (word >> (tok % 32)) & 1:
                out[r, tok] = float("-inf")
    return out


@pytest.mark.parametrize("vocab", [32, 100, 263])
def test_bitmask_matches_a_per_token_reference(vocab):
    rng = np.random.default_rng(vocab)
    logits = torch.randn(5, vocab)
    rows = [1, 4]
    bits = rng.integers(-(2**31), 2**31, size=(2, bitmask_width(vocab)), dtype=np.int64)
    bitmask = bits.astype(np.int32)
    bitmask[0, 0] = -1  # all 32 bits, the sign bit included
    got = apply_token_bitmask(logits, torch.tensor(rows), torch.from_numpy(bitmask))
    assert torch.equal(got, _reference_mask(logits, rows, bitmask))
    assert torch.equal(got[[0, 2, 3]], logits[[0, 2, 3]])  # rows without a grammar untouched


def test_rows_without_a_grammar_sample_as_before():
    logits = torch.randn(4, 64)
    mask = np.zeros((1, 2), np.int32)
    mask[0, 1] = 1 << 3  # only token 35

    class Masks:
        def result(self):
            return mask

    params = [SamplingParams(temperature=0.8), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.8, grammar=GrammarSpec("regex", "x")),
              SamplingParams(temperature=0.0)]
    specs = [SampleSpec(p, seed=i, counter=3) for i, p in enumerate(params)]
    specs[2].mask = (Masks(), 0)
    t = SamplingTensors.build(params, [s.seed for s in specs], [3] * 4, 64, torch.device("cpu"),
                              specs)
    free = SamplingTensors.build(params, [s.seed for s in specs], [3] * 4, 64,
                                 torch.device("cpu"), [SampleSpec(p, i, 3) for i, p in
                                                       enumerate(params)])
    got, ref = sample(logits, t), sample(logits, free)
    assert got[2].item() == 35
    assert torch.equal(got[[0, 1, 3]], ref[[0, 1, 3]])
    assert params[2].changes_logits and not params[0].changes_logits  # host sampling path


def test_zero_noise_never_picks_a_masked_token(monkeypatch):
    """A noise draw of u = 1.0 (fp32 rounding, 1 in 2^25) used to give 0 / 0 = nan for a masked
    token, and argmax picks a nan: a token the grammar (or top-k) had ruled out."""
    def ones(seeds, counters, vocab):
        return torch.ones(len(seeds), vocab)
    monkeypatch.setattr(sampler_mod, "uniform_noise", ones)
    logits = torch.full((1, 8), -1.0)
    logits[0, 5] = 3.0
    ids = sample(logits, SamplingTensors.build([SamplingParams(temperature=1.0, top_k=1)], [0],
                                               [0], 8, torch.device("cpu")))
    assert ids.item() == 5


def test_grammar_from_the_wire():
    s = pb.SamplingParams()
    assert spec_from_wire(s) is None
    s.grammar.kind = pb.Grammar.REGEX
    s.grammar.text = "[0-9]+"
    assert spec_from_wire(s) == GrammarSpec("regex", "[0-9]+")
    s.grammar.kind = 99  # an unknown kind reads as none (the wire's rule)
    assert spec_from_wire(s) is None


# --- tiny-coder -------------------------------------------------------------------------------
needs_model = pytest.mark.skipif(not (TINY_CODER / "model.safetensors").exists(),
                                 reason="models/tiny-coder is not in this checkout")


@pytest.fixture(scope="module")
def engine():
    from backend.engine.assemble import BackendConfig, create_engine

    eng, loaded = create_engine(BackendConfig(model=str(TINY_CODER)))
    return eng, loaded.tokenizer


def _run(eng, requests: dict) -> dict[str, tuple[list[int], str]]:
    for rid, (prompt, params) in requests.items():
        assert eng.add_request(rid, prompt, params) is None
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    finish: dict[str, str] = {}
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id].extend(o.new_token_ids)
            if o.finish_reason:
                finish[o.request_id] = o.finish_reason
    eng.check_integrity()
    return {rid: (ids, finish[rid]) for rid, ids in out.items()}


def _text(tok, ids) -> str:
    return tok.decode([t for t in ids if t not in tok.eos_token_ids])


@needs_model
def test_tiny_coder_json_schemas_greedy_and_sampled(engine):
    eng, tok = engine
    prompt = tok.encode_chat([{"role": "user", "content": "Reply with a JSON object."}])
    schemas = [random_schema(1000 + i, bounded=True) for i in range(8)] + \
        [random_schema(2000 + i) for i in range(8)]
    reqs = {f"s{i}-{temp}": (prompt, SamplingParams(
        max_tokens=400, temperature=temp, seed=i, grammar=GrammarSpec.json_schema(s)))
        for i, s in enumerate(schemas) for temp in ((0.0, 0.7) if i < 8 else (0.7,))}
    free = tok.encode("def fib(n):")
    reqs["free"] = (free, SamplingParams(max_tokens=12))
    alone = _run(eng, {"alone": (free, SamplingParams(max_tokens=12))})["alone"]
    results = _run(eng, reqs)
    num_cut = 0
    for rid, (ids, finish) in results.items():
        if rid == "free":
            continue
        i = int(rid[1:].split("-")[0])
        if finish == "length" and i >= 8:  # an unbounded string the model ran away in
            num_cut += 1
            continue
        assert finish == "stop", (rid, _text(tok, ids))
        jsonschema.validate(json.loads(_text(tok, ids)), schemas[i])  # every finished one
    # Model-dependent: tiny-coder v4 runs away in 3 of the 8 unbounded schemas (s11, s15 in an
    # integer's digits, s13 in a string; v3 in none); the margin is for another CPU's rounding.
    assert num_cut <= 4
    assert results["free"] == alone  # sharing the batch with grammar rows changes nothing


@needs_model
def test_tiny_coder_regex_choice_and_key_order(engine):
    eng, tok = engine
    prompt = tok.encode("# a version string\nVERSION = '")
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"},
                                               "alpha": {"enum": ["x", "y"]}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    out = _run(eng, {
        "re": (prompt, SamplingParams(max_tokens=30, temperature=0.7, seed=1,
                                      grammar=GrammarSpec("regex", r"v[0-9]\.[0-9]{1,2}"))),
        "choice": (prompt, SamplingParams(max_tokens=30, temperature=0.7, seed=2,
                                          grammar=GrammarSpec.choice(["alpha", "beta"]))),
        "order": (prompt, SamplingParams(max_tokens=60, grammar=GrammarSpec.json_schema(schema))),
    })
    assert re.fullmatch(r"v[0-9]\.[0-9]{1,2}", _text(tok, out["re"][0]))
    assert _text(tok, out["choice"][0]) in ("alpha", "beta")
    text = _text(tok, out["order"][0])
    assert text.index('"zeta"') < text.index('"alpha"')  # the schema's property order


@needs_model
def test_an_engine_without_grammars_refuses_them(engine):
    eng, tok = engine
    grammars, eng.grammars = eng.grammars, None
    try:
        reason = eng.add_request("x", tok.encode("a"), SamplingParams(
            grammar=GrammarSpec("json_object")))
    finally:
        eng.grammars = grammars
    assert reason is not None and "structured output" in reason


def _run_turns(eng, requests: dict, turn) -> tuple[dict, int]:
    """Drive `turn` (engine.step or engine.advance) to the end; (rid -> (ids, finish), number of
    pipelined steps that carried a grammar row on the device-greedy path)."""
    for rid, (prompt, params) in requests.items():
        assert eng.add_request(rid, prompt, params) is None
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    finish: dict[str, str] = {}
    masked_pipelined = 0
    while eng.has_unfinished():
        for o in turn():
            out[o.request_id].extend(o.new_token_ids)
            if o.finish_reason:
                finish[o.request_id] = o.finish_reason
        step = eng._inflight
        if step is not None and step.pipelined and step.mask_rows:
            masked_pipelined += 1
    eng.check_integrity()
    return {rid: (ids, finish[rid]) for rid, ids in out.items()}, masked_pipelined


@needs_model
def test_greedy_grammar_rows_stay_on_the_pipelined_device_path(engine):
    """Greedy rows with a grammar keep async scheduling: the step is launched before the one
    before it is read back, and its argmax is redone under the mask once that step's tokens
    are consumed. Same tokens as the synchronous loop, every output valid, and the steps with
    constrained rows were pipelined."""
    eng, tok = engine
    prompt = tok.encode_chat([{"role": "user", "content": "Reply with a JSON object."}])
    schemas = [random_schema(3000 + i, bounded=True) for i in range(6)]

    def reqs():
        # 600: tiny-coder v4's greedy object for schema 3001 is 300 tokens long (v3's fit in 300)
        r = {f"g{i}": (prompt, SamplingParams(max_tokens=600,
                                              grammar=GrammarSpec.json_schema(s)))
             for i, s in enumerate(schemas)}
        r["free"] = (tok.encode("def fib(n):"), SamplingParams(max_tokens=20))
        return r

    sync, _ = _run_turns(eng, reqs(), eng.step)
    eng.async_scheduling = True
    try:
        piped, num_masked = _run_turns(eng, reqs(), eng.advance)
    finally:
        eng.async_scheduling = False
    assert piped == sync
    assert num_masked > 10
    for i, s in enumerate(schemas):
        ids, finish = piped[f"g{i}"]
        assert finish == "stop"
        jsonschema.validate(json.loads(_text(tok, ids)), s)


# --- CUDA (skipped on the CPU; scripts/gpu_structured_run.sh runs them on the H200) -----------
@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [263, 32256])
def test_bitmask_on_cuda_matches_the_cpu(vocab):
    rng = np.random.default_rng(7)
    logits = torch.randn(64, vocab)
    rows = torch.arange(0, 64, 2)
    bitmask = torch.from_numpy(rng.integers(-(2**31), 2**31, size=(32, bitmask_width(vocab)),
                                            dtype=np.int64).astype(np.int32))
    cpu = apply_token_bitmask(logits, rows, bitmask)
    gpu = apply_token_bitmask(logits.cuda(), rows.cuda(), bitmask.cuda())
    assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.gpu
@needs_model
def test_cuda_graph_steps_with_grammar_rows_stay_pipelined_and_valid():
    """On CUDA with graphs and async scheduling: greedy constrained rows are masked on the
    device path (mask_greedy over the graph's static logits), the steps replay graphs, and the
    tokens equal the synchronous loop's."""
    from backend.engine.assemble import BackendConfig, ServingOptions, create_engine

    eng, loaded = create_engine(BackendConfig(model=str(TINY_CODER), device="cuda"),
                                ServingOptions(capture=False))
    tok = loaded.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "Reply with a JSON object."}])
    schemas = [random_schema(4000 + i, bounded=True) for i in range(8)]

    def reqs():
        return {f"g{i}": (prompt, SamplingParams(max_tokens=300,
                                                 grammar=GrammarSpec.json_schema(s)))
                for i, s in enumerate(schemas)}

    eng.async_scheduling = False
    sync, _ = _run_turns(eng, reqs(), eng.step)
    eng.async_scheduling = True
    piped, num_masked = _run_turns(eng, reqs(), eng.advance)
    assert piped == sync and num_masked > 10
    for i, s in enumerate(schemas):
        jsonschema.validate(json.loads(_text(tok, piped[f"g{i}"][0])), s)


@needs_model
def test_speculation_with_a_grammar_drafts_only_what_it_accepts(engine):
    """Predicted Outputs on constrained requests: the drafts are cut where the grammar would
    refuse them, each verified position is sampled under the mask after its draft prefix, and
    the output equals the one without speculation (greedy), valid, with drafts accepted."""
    from backend.engine.assemble import BackendConfig, create_engine
    from scheduler.speculation import SpeculationConfig

    _, tok = engine
    spec_eng, _ = create_engine(BackendConfig(model=str(TINY_CODER),
                                              speculation_config=SpeculationConfig()))
    prompt = tok.encode_chat([{"role": "user", "content": "Reply with a JSON object."}])
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["io", "cpu"]}, "maxItems": 3}},
        "required": ["name", "n", "tags"], "additionalProperties": False}
    plain = _run(engine[0], {"p": (prompt, SamplingParams(
        max_tokens=200, grammar=GrammarSpec.json_schema(schema)))})["p"]
    assert plain[1] == "stop"
    # the prediction: the real output, with a stretch the grammar refuses spliced in
    junk = tok.encode(" }}}]] not json", add_special_tokens=False)
    prediction = plain[0][:6] + junk + plain[0][6:]
    assert spec_eng.add_request("s", prompt, SamplingParams(
        max_tokens=200, grammar=GrammarSpec.json_schema(schema)), prediction=prediction) is None
    ids, drafted, accepted = [], 0, 0
    while spec_eng.has_unfinished():
        for o in spec_eng.step():
            ids.extend(o.new_token_ids)
            drafted, accepted = o.num_draft_tokens, o.num_accepted_draft_tokens
    spec_eng.check_integrity()
    assert ids == plain[0]
    jsonschema.validate(json.loads(_text(tok, ids)), schema)
    assert accepted > 10 and drafted >= accepted


def test_engines_without_a_grammar_path_refuse_it():
    from backend.engine.assemble import BackendConfig, create_engine

    eng, _ = create_engine(BackendConfig(model="echo"))
    reason = eng.add_request("x", [1, 2, 3], SamplingParams(grammar=GrammarSpec("json_object")))
    assert reason is not None and "structured output" in reason


def test_staged_inputs_reach_the_device_unchanged_through_buffers_used_in_turn():
    """`StaticBuffers.stage` (the masks' row indexes and bitmasks of `mask_greedy`): the values
    arrive as given, in the dtype asked, and a larger input grows the buffer."""
    from backend.runner.step import StaticBuffers

    b = StaticBuffers(16, 4, 4, torch.device("cpu"))
    rows = b.stage("mask_rows", [3, 1, 2], torch.long, torch.device("cpu"))
    assert rows.dtype == torch.long and rows.tolist() == [3, 1, 2]
    bits = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    staged = b.stage("mask_bits", bits, torch.int32, torch.device("cpu"))
    assert torch.equal(staged, torch.from_numpy(bits))
    big = b.stage("mask_rows", list(range(100)), torch.long, torch.device("cpu"))
    assert big.tolist() == list(range(100))


@pytest.mark.gpu
def test_staging_does_not_wait_for_the_kernels_queued_before_it():
    """A plain torch.tensor(values, device="cuda") from pageable memory waits for the work queued
    before it: called while a step ran, it held the H200's host for the whole forward (issue 29:
    17.5 ms of a 19.7 ms step). Staged through pinned buffers it returns at once, and the values
    are right once the stream gets there."""
    from backend.runner.step import StaticBuffers

    dev = torch.device("cuda")
    b = StaticBuffers(16, 4, 4, dev)
    a = torch.randn(4096, 4096, device=dev)
    b.stage("mask_rows", [0], torch.long, dev)  # first use allocates
    torch.cuda.synchronize()
    for _ in range(40):  # ~tens of ms of queued work
        a = a @ a
        a = a / a.norm()
    t = time.perf_counter()
    rows = b.stage("mask_rows", list(range(64)), torch.long, dev)
    bits = b.stage("mask_bits", np.ones((32, 1008), dtype=np.int32), torch.int32, dev)
    host_ms = (time.perf_counter() - t) * 1000
    start = time.perf_counter()
    torch.cuda.synchronize()
    queued_ms = (time.perf_counter() - start) * 1000
    assert queued_ms > 5.0 and host_ms < 0.2 * queued_ms, (host_ms, queued_ms)
    assert rows.tolist() == list(range(64)) and int(bits.sum()) == 32 * 1008
