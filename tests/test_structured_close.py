"""Length-safe structured output (issue 29): near the end of its max_tokens a constrained request
is closed inside its grammar (tokenizer/grammar_close.py, backend/runner/grammar.py), so a
model that runs away in a string still returns JSON that validates, reported as "length"."""
from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from bench.structured.schema_gen import random_schema
from tokenizer.grammar import GrammarCompiler, GrammarSpec, load_tokenizer
from tokenizer.grammar_close import Closer

TINY_CODER = Path(__file__).resolve().parents[1] / "models" / "tiny-coder"
pytestmark = pytest.mark.skipif(not (TINY_CODER / "model.safetensors").exists(),
                                reason="models/tiny-coder is not in this checkout")


@pytest.fixture(scope="module")
def vocab():
    tok_json = (TINY_CODER / "tokenizer.json").read_text()
    size = json.loads((TINY_CODER / "config.json").read_text())["vocab_size"]
    tok = load_tokenizer(tok_json, size, (2,))
    return tok, GrammarCompiler(tok), Closer(tok), size


def _random_walk(matcher, size: int, rng: random.Random, steps: int) -> list[int]:
    """Up to `steps` tokens drawn uniformly from what the grammar allows (never the end)."""
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    bitmask = allocate_token_bitmask(1, size)
    out = []
    for _ in range(steps):
        if matcher.is_accepting():
            break
        fill_next_token_bitmask(matcher, bitmask, 0)
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:size]
        allowed = [int(t) for t in np.flatnonzero(bits) if t != 2]
        if not allowed:
            break
        t = rng.choice(allowed)
        assert matcher.consume_token(t)
        out.append(t)
    return out


def test_any_prefix_of_a_schema_closes_to_valid_json(vocab):
    """Prefixes a random walk under the mask reaches (inside strings, numbers, keys, arrays) of
    80 generated schemas: the completion found validates against the schema each time."""
    from gateway.structured import closed_objects  # (the GPU machine runs the rest without it)

    tok, comp, closer, size = vocab
    rng = random.Random(7)
    for i in range(80):
        schema = random_schema(3000 + i)
        m = comp.matcher(GrammarSpec.json_schema(closed_objects(schema)))
        prefix = _random_walk(m, size, rng, rng.randint(0, 100))
        plan = closer.plan(m, 256)
        assert plan is not None, (i, tok.decode_str(prefix))
        text = tok.decode_str(prefix + plan)
        jsonschema.validate(json.loads(text), schema)


def test_a_pattern_the_model_runs_away_in_is_closed_through_its_dot(vocab):
    tok, comp, closer, _ = vocab
    schema = {"type": "object", "properties": {"v": {"type": "string",
                                                     "pattern": "^v[0-9]+\\.[0-9]+$"}},
              "required": ["v"], "additionalProperties": False}
    m = comp.matcher(GrammarSpec.json_schema(schema))
    for t in tok.tokenize_str('{"v": "v8226336345711678555309'):
        assert m.consume_token(t)
    plan = closer.plan(m, 64)
    # one digit more at most (the byte just written is tried last), then the dot
    assert tok.decode_str(plan) in ('.0"}', '0.0"}')
    assert m.validate_tokens(plan) == len(plan)  # the matcher itself was left as it was


@pytest.fixture(scope="module")
def engine():
    from backend.engine.assemble import BackendConfig, create_engine

    eng, loaded = create_engine(BackendConfig(model=str(TINY_CODER)))
    return eng, loaded.tokenizer


def _run(eng, tok, schema, max_tokens, temperature, close=True, prompt=None):
    from backend.runner.sampler import SamplingParams

    saved, eng.grammars.close_to_budget = eng.grammars.close_to_budget, close
    prompt = prompt or tok.encode_chat([{"role": "user", "content": "Reply with a JSON object."}])
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=3,
                            grammar=GrammarSpec.json_schema(schema))
    assert eng.add_request("r", prompt, params) is None
    ids, finish = [], None
    while eng.has_unfinished():
        for o in eng.step():
            ids += o.new_token_ids
            finish = o.finish_reason or finish
    eng.check_integrity()
    eng.grammars.close_to_budget = saved
    return tok.decode([t for t in ids if t not in tok.eos_token_ids]), finish, len(ids)


# schema 176 of bench.structured.schemas ({"name": a free string}), in which tiny-coder wrote
# "Kukana/" until max_tokens; a prompt that repeats it makes that happen every time
RUNAWAY = random_schema(176)
LOOP = 'names = ["' + "Kukana/" * 36 + '"]\nrow = '


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_runaway_string_ends_as_valid_json_reported_as_length(engine, temperature):
    eng, tok = engine
    prompt = tok.encode(LOOP)
    cut, finish, _ = _run(eng, tok, RUNAWAY, 120, temperature, False, prompt)
    assert finish == "length" and cut.startswith('{"name": "Kukana/Kukana/')
    with pytest.raises(ValueError):  # without closing: cut inside the string
        json.loads(cut)
    text, finish, num = _run(eng, tok, RUNAWAY, 120, temperature, True, prompt)
    jsonschema.validate(json.loads(text), RUNAWAY)
    assert finish == "length" and num <= 120  # closed to fit, and said so


def test_outputs_that_end_by_themselves_are_unchanged(engine):
    eng, tok = engine
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {
        "type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"],
        "additionalProperties": False}
    assert _run(eng, tok, schema, 60, 0.7) == _run(eng, tok, schema, 60, 0.7, close=False)


def _closing_requests(tok):
    from backend.runner.sampler import SamplingParams

    prompt = tok.encode(LOOP)
    return {f"c{n}": (prompt, SamplingParams(max_tokens=n, grammar=GrammarSpec.json_schema(
        RUNAWAY))) for n in (40, 64, 100)}


def test_closing_on_the_pipelined_greedy_path_matches_the_synchronous_loop(engine):
    """Async scheduling: a step is launched before the previous one is read back, and the forced
    token reaches it through the mask computed once that step's tokens are consumed (argmax
    redone under it). Same tokens as the synchronous loop, each output valid and 'length'."""
    from test_structured_backend import _run_turns

    eng, tok = engine
    sync, _ = _run_turns(eng, _closing_requests(tok), eng.step)
    eng.async_scheduling = True
    try:
        piped, num_masked = _run_turns(eng, _closing_requests(tok), eng.advance)
    finally:
        eng.async_scheduling = False
    assert piped == sync and num_masked > 10
    for ids, finish in piped.values():
        jsonschema.validate(json.loads(tok.decode([t for t in ids if t not in tok.eos_token_ids])),
                            RUNAWAY)
        assert finish == "length"


@pytest.mark.gpu
def test_closing_on_cuda_graph_steps():
    """On CUDA, graphs and async scheduling (scripts/gpu_structured_run.sh): as above."""
    from test_structured_backend import _run_turns

    from backend.engine.assemble import BackendConfig, ServingOptions, create_engine

    eng, loaded = create_engine(BackendConfig(model=str(TINY_CODER), device="cuda"),
                                ServingOptions(capture=False))
    tok = loaded.tokenizer
    eng.async_scheduling = False
    sync, _ = _run_turns(eng, _closing_requests(tok), eng.step)
    eng.async_scheduling = True
    piped, num_masked = _run_turns(eng, _closing_requests(tok), eng.advance)
    assert piped == sync and num_masked > 10
    for ids, finish in piped.values():
        jsonschema.validate(json.loads(tok.decode([t for t in ids if t not in tok.eos_token_ids])),
                            RUNAWAY)
        assert finish == "length"
