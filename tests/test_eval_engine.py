"""evals.engine / evals.cli: settings, the all-rows and teacher-forced drivers, and the
`tidegate eval` commands on small random models (CPU, seconds)."""
from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import pytest
import torch
from backend_helpers import hf_model, make_checkpoint

from evals import cli as ev
from evals.engine import (
    EngineSettings,
    EngineShape,
    EvalError,
    build_engine,
    check_settings,
    greedy_decode,
    parse_settings,
    score_all_rows,
    sequence_logits,
)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL_FILES = ["this.py", "keyword.py", "colorsys.py"]  # short stdlib files, every CPython 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"), "gqa4_tied_rope4", seed=3)


@pytest.fixture
def heldout_list(tmp_path):
    present = [f for f in SMALL_FILES if (STDLIB / f).is_file()]
    assert present, f"none of {SMALL_FILES} under {STDLIB}"
    path = tmp_path / "heldout_files.txt"
    path.write_text("".join(f + "\n" for f in present) + "not/there.py\n")
    return path


def test_parse_settings():
    base = EngineSettings(dtype="float32")
    s = parse_settings(" dtype=bfloat16 , kv_cache_dtype=auto,quant=none ", base)
    assert s == EngineSettings(dtype="bfloat16", kv_cache_dtype="auto", quantization="none")
    assert parse_settings("", base) == base
    assert parse_settings("kv-dtype=auto,device=cpu", base).label() == \
        "dtype=float32,kv-cache-dtype=auto,quantization=none,device=cpu"
    with pytest.raises(EvalError, match="unknown setting 'block'.*keys: dtype, kv-cache-dtype"):
        parse_settings("block=16", base)
    with pytest.raises(EvalError, match="not key=value"):
        parse_settings("dtype", base)


def test_unsupported_settings_list_the_supported_ones():
    with pytest.raises(EvalError, match=r"kv-cache-dtype 'fp8_e5m2'.*\(supported: auto"):
        check_settings(EngineSettings(kv_cache_dtype="fp8_e5m2"))
    with pytest.raises(EvalError, match=r"quantization 'int3'.*\(supported: none"):
        check_settings(EngineSettings(quantization="int3"))
    with pytest.raises(EvalError, match=r"dtype 'float8'.*auto, float32, bfloat16, float16"):
        check_settings(EngineSettings(dtype="float8"))


@pytest.mark.parametrize("budget", [16, 2048])
def test_all_rows_match_transformers(checkpoint, budget):
    """Every row of every prefill chunk (chunked under a 16-token budget: the later chunks
    read the earlier ones from the paged KV cache) against transformers in float32."""
    engine, _ = build_engine(str(checkpoint), EngineSettings(dtype="float32"),
                             EngineShape(max_num_batched_tokens=budget, block_size=4))
    gen = torch.Generator().manual_seed(1)
    tokens = [256] + torch.randint(0, 256, (45,), generator=gen).tolist()
    chunks = {}

    def note(rid, start, logits):
        chunks.setdefault(rid, []).append((start, logits.shape[0]))

    ours = sequence_logits(engine, tokens)
    with torch.no_grad():
        ref = hf_model(checkpoint)(torch.tensor([tokens])).logits[0].float()
    assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()
    score_all_rows(engine, [("x", tokens)], note)
    expected = [(0, 46)] if budget >= 46 else [(0, 16), (16, 16), (32, 14)]
    assert chunks["x"] == expected
    engine.check_integrity()


def test_teacher_forced_decode_matches_prefill_rows(checkpoint):
    """greedy_decode(forced=f)[t] is the greedy token after prompt + f[:t] (decode path), which
    the all-rows prefill of prompt + f gives too; forcing a run's own tokens reproduces it."""
    engine, _ = build_engine(str(checkpoint), EngineSettings(dtype="float32"), EngineShape())
    gen = torch.Generator().manual_seed(7)
    prompts = [[256] + torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 17, 30)]
    free = greedy_decode(engine, prompts, 12)
    assert greedy_decode(engine, prompts, 12, forced=free) == free
    forced = [torch.randint(0, 256, (12,), generator=gen).tolist() for _ in prompts]
    pred = greedy_decode(engine, prompts, 12, forced=forced)
    for p, f, got in zip(prompts, forced, pred):
        rows = sequence_logits(engine, p + f[:-1])[len(p) - 1:]
        for t, row in enumerate(rows):
            best = int(row.argmax())
            # equal, or a near-tie between two paths' float rounding
            assert got[t] == best or row[best] - row[got[t]] < 1e-4, (t, got[t], best)
    engine.check_integrity()


def test_perplexity_of_a_random_preset_is_about_its_vocabulary(heldout_list):
    full = ev.perplexity("tiny", EngineSettings(), heldout_list=heldout_list,
                         stdlib_root=STDLIB, max_tokens=1500, progress=False)
    chunked = ev.perplexity("tiny", EngineSettings(), EngineShape(max_num_batched_tokens=96),
                            heldout_list=heldout_list, stdlib_root=STDLIB, max_tokens=1500,
                            window=128, progress=False)
    assert full["tokens"] == chunked["tokens"] == 1500
    assert full["files_skipped"] == 1 and full["files_listed"] == len(SMALL_FILES) + 1
    assert 150 < full["ppl"] < 450, full["ppl"]  # random weights: about vocab_size = 259
    # other windows (128-token contexts) give a slightly different number; chunking does not
    assert chunked["chunked_windows"] >= chunked["windows"] // 2  # 128-token windows, 96/step
    assert abs(math.log(chunked["ppl"] / full["ppl"])) < 0.05
    same = ev.perplexity("tiny", EngineSettings(), EngineShape(max_num_batched_tokens=2048),
                         heldout_list=heldout_list, stdlib_root=STDLIB, max_tokens=1500,
                         window=128, progress=False)
    assert same["chunked_windows"] == 0
    assert same["ppl"] == pytest.approx(chunked["ppl"], rel=1e-5)


def test_agreement_with_itself_is_one(heldout_list):
    r = ev.agreement("tiny", EngineSettings(), EngineSettings(), num_prompts=3, prompt_len=16,
                     max_tokens=8, heldout_list=heldout_list, stdlib_root=STDLIB, progress=False)
    assert r["agreement"] == 1.0 and r["positions"] == 24 and r["exact_continuations"] == 1.0


def test_cli_perplexity_json_and_errors(heldout_list, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = ev.main(["perplexity", "--model", "tiny", "--heldout-list", str(heldout_list),
                  "--stdlib-root", str(STDLIB), "--max-tokens", "300", "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.out.startswith("ppl ") and "tokens 300" in captured.out
    assert "[perplexity" in captured.err  # progress on stderr
    report = json.loads(out.read_text())
    assert report["tokens"] == 300 and report["per_file"][0]["path"] == SMALL_FILES[0]

    rc = ev.main(["perplexity", "--model", "tiny", "--kv-cache-dtype", "int8", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "kv-cache-dtype 'int8' is not supported" in err and "supported: auto" in err
    rc = ev.main(["agreement", "--model", "tiny", "--b", "quantization=int3", "--quiet"])
    assert rc == 2 and "supported: none" in capsys.readouterr().err
    rc = ev.main(["perplexity", "--model", "tiny", "--heldout-list", str(tmp_path / "x.txt")])
    assert rc == 2 and "not found" in capsys.readouterr().err
