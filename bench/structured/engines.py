"""XGrammar vs llguidance on one vocabulary: tokenizer setup, schema compile, mask per token.

    python -m bench.structured.engines [--tokenizer models/tiny-coder/tokenizer.json]
        [--repeats 10] [--flexible-whitespace]

The measurement behind tokenizer/grammar.py's choice. A nested JSON schema (pattern, enum,
nested object, array, number, boolean) is compiled `--repeats` times, each time with a new
description so that no cache answers; the first mask is counted with the compile (both engines
build lexer state lazily). Then a valid instance is walked token by token: every step's mask
computed (and checked to allow the next token), the token accepted. XGrammar is optional
(`pip install xgrammar`; it imports torch, so only the backend could use it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[a-z_]+$"},
    "version": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["io", "net", "cpu"]}},
    "owner": {"type": "object", "properties": {"login": {"type": "string"},
                                               "id": {"type": "integer"}},
              "required": ["login", "id"], "additionalProperties": False},
    "ratio": {"type": "number"}, "ok": {"type": "boolean"}},
    "required": ["name", "version", "tags", "owner", "ratio", "ok"],
    "additionalProperties": False}
INSTANCE = {"name": "tidegate_server", "version": 12, "tags": ["io", "cpu", "net"],
            "owner": {"login": "octocat and friends", "id": 583231}, "ratio": 0.125, "ok": True}


def _schema(r: int) -> dict:
    return {**SCHEMA, "description": f"v{r}"}  # a new schema each time: no cache hit


def llguidance_walk(tokenizer_json: str, vocab: int, eos: int, ids, repeats: int, flex: bool):
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
    setup = time.perf_counter() - t0
    compiles, masks = [], []
    options = {"whitespace_flexible": flex}
    if not flex:
        options.update(item_separator=",", key_separator=":")
    for r in range(repeats):
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(
            _schema(r), defaults=options))
        bm = allocate_token_bitmask(1, vocab)
        fill_next_token_bitmask(m, bm, 0)
        compiles.append(time.perf_counter() - t0)
        for t in ids:
            t0 = time.perf_counter()
            fill_next_token_bitmask(m, bm, 0)
            masks.append(time.perf_counter() - t0)
            assert (int(bm[0, t // 32]) >> (t % 32)) & 1, f"token {t} masked"
            assert m.consume_token(t), m.get_error()
    return setup, compiles, masks


def xgrammar_walk(tokenizer_path: str, vocab: int, eos: int, ids, repeats: int, flex: bool):
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(
        tokenizer_file=tokenizer_path), vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    setup = time.perf_counter() - t0
    compiles, masks = [], []
    kw = {} if flex else {"separators": (",", ":")}
    for r in range(repeats):
        t0 = time.perf_counter()
        m = xgr.GrammarMatcher(compiler.compile_json_schema(
            json.dumps(_schema(r)), any_whitespace=flex, strict_mode=True, **kw))
        bm = xgr.allocate_token_bitmask(1, vocab)
        m.fill_next_token_bitmask(bm, 0)
        compiles.append(time.perf_counter() - t0)
        for t in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bm, 0)
            masks.append(time.perf_counter() - t0)
            assert (int(bm[0, t // 32]) >> (t % 32)) & 1, f"token {t} masked"
            assert m.accept_token(t)
    return setup, compiles, masks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="models/tiny-coder/tokenizer.json")
    p.add_argument("--eos", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--flexible-whitespace", action="store_true")
    args = p.parse_args(argv)
    from pathlib import Path

    from tokenizers import Tokenizer

    text = Path(args.tokenizer).read_text(encoding="utf-8")
    tok = Tokenizer.from_str(text)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    flex = args.flexible_whitespace
    instance = json.dumps(INSTANCE, indent=2) if flex else \
        json.dumps(INSTANCE, separators=(",", ":"))
    ids = tok.encode(instance, add_special_tokens=False).ids
    print(f"vocabulary {vocab}, instance {len(ids)} tokens, "
          f"{'flexible' if flex else 'compact'} whitespace, {args.repeats} schemas")
    walks = {"llguidance": lambda: llguidance_walk(text, vocab, args.eos, ids, args.repeats, flex),
             "xgrammar": lambda: xgrammar_walk(args.tokenizer, vocab, args.eos, ids,
                                               args.repeats, flex)}
    for name, walk in walks.items():
        try:
            setup, compiles, masks = walk()
        except ImportError as exc:
            print(f"{name}: not installed ({exc})")
            continue
        print(f"{name:10s} tokenizer {setup * 1e3:6.1f} ms | compile + first mask median "
              f"{statistics.median(compiles) * 1e3:5.2f} ms | mask per token median "
              f"{statistics.median(masks) * 1e6:5.1f} us, p90 "
              f"{np.percentile(masks, 90) * 1e6:5.1f} us, mean {statistics.mean(masks) * 1e6:5.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
