"""training/train.py `sweep` (candidate shapes chosen by validation loss) and `card`
(the engine section rendered from eval.json), on the CPU with microscopic shapes and a few steps."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = ["1x32x64/2/1", "2x32x64/2/1", "1x48x96/2/1"]


def _trainer():
    from training import train

    return train


def _python_file(rng: random.Random, i: int) -> str:
    names = ["alpha", "beta", "gamma", "delta", "value", "items", "total", "count"]
    out = [f'"""Module {i}."""\n', "import os\n\n"]
    for f in range(rng.randint(2, 4)):
        a, b = rng.sample(names, 2)
        out.append(f"def {a}_{f}_{i}({a}, {b}=None):\n")
        out.append(f'    """Return the {a} of {b}."""\n')
        out.append(f"    if {b} is None:\n        {b} = {rng.randint(0, 99)}\n")
        out.append(f"    for x in range({a}):\n        {b} += x * {rng.randint(1, 9)}\n")
        out.append(f"    return {b}\n\n\n")
    return "".join(out)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "training.train", *args], capture_output=True, text=True,
                       env=env, timeout=600, check=False)
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def prep(tmp_path_factory) -> Path:
    """A tiny corpus (train / val / heldout packages) through `prepare` with a 300-id vocabulary."""
    root = tmp_path_factory.mktemp("sweep")
    rng = random.Random(7)
    corpus = root / "corpus"
    corpus.mkdir()
    with open(corpus / "corpus.jsonl", "w", encoding="utf-8") as f:
        for split, pkg, n in (("train", "pkg_a", 40), ("val", "pkg_v", 6), ("heldout", "pkg_h", 4)):
            for i in range(n):
                rec = {"split": split, "path": f"site-packages/{pkg}/m{i}.py",
                       "text": _python_file(rng, i)}
                f.write(json.dumps(rec) + "\n")
    out = root / "prep"
    _run("prepare", "--corpus", str(corpus), "--out", str(out), "--vocab-size", "300",
         "--tokenizer-sample", "1.0")
    return out


def _sweep(prep: Path, out: Path, *extra: str, check: bool = True):
    return _run("sweep", "--prep", str(prep), "--out", str(out), "--device", "cpu",
                "--candidates", *CANDIDATES, "--candidate-steps", "6", "--steps", "8",
                "--batch-size", "2", "--seq-len", "32", "--warmup-steps", "2",
                "--eval-every", "4", "--log-every", "2", "--eval-batch-size", "16",
                "--sample-tokens", "4", "--seed", "5", *extra, check=check)


@pytest.fixture(scope="module")
def swept(prep, tmp_path_factory) -> tuple[Path, Path]:
    """Two sweeps from the same seed into two directories."""
    root = tmp_path_factory.mktemp("runs")
    _sweep(prep, root / "a")
    _sweep(prep, root / "b")
    return root / "a", root / "b"


def test_sweep_trains_the_candidate_with_the_lowest_validation_loss(swept):
    a, _ = swept
    m = json.loads((a / "metrics.json").read_text())
    sw = m["sweep"]
    assert [c["shape"] for c in sw["candidates"]] == CANDIDATES
    for c in sw["candidates"]:
        assert c["steps"] == 6 and c["tokens"] == 6 * 2 * 32
        assert c["val_loss"] > 0 and c["val_bits_per_byte"] > 0
    losses = [c["val_loss"] for c in sw["candidates"]]
    assert len(set(losses)) == len(losses)  # the shapes really trained differently
    best = min(sw["candidates"], key=lambda c: c["val_loss"])
    assert sw["winner"] == best["shape"]
    # the shipped model is the winner's shape, trained for --steps afresh
    layers, hidden, inter = map(int, best["shape"].split("/")[0].split("x"))
    cfg = json.loads((a / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == \
        (layers, hidden, inter)
    assert m["steps"] == 8 and m["model_config"]["tie_word_embeddings"] is True
    # the candidates' runs are in the log, tagged, and the loss plot is of the final run only
    log = [json.loads(x) for x in (a / "train_log.jsonl").read_text().splitlines()]
    assert {r["candidate"] for r in log if "candidate" in r} == set(CANDIDATES)
    assert any(r["type"] == "train" and "candidate" not in r for r in log)


def test_sweep_is_deterministic_from_the_seed(swept):
    a, b = swept
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in swept)
    assert [c["val_loss"] for c in ma["sweep"]["candidates"]] == \
        [c["val_loss"] for c in mb["sweep"]["candidates"]]
    assert ma["heldout"]["bits_per_byte"] == mb["heldout"]["bits_per_byte"]
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_param_count_matches_the_model():
    t = _trainer()
    for spec, tie in (("2x32x64/2/1", True), ("7x384x1024/6/2", True), ("3x48x80/4/2", False)):
        c = t.model_config(type("A", (), {"max_position_embeddings": 64, "tie_embeddings": tie}),
                           300, t.Shape.parse(spec))
        assert t.param_count(c) == t.count_params(t.TinyLlama(c))["total"]
    # the default candidates fit the repository's limit, in bf16
    for spec in t.DEFAULT_CANDIDATES:
        c = t.model_config(type("A", (), {"max_position_embeddings": 2048,
                                          "tie_embeddings": True}), 8192, t.Shape.parse(spec))
        assert 13e6 < t.param_count(c) <= t.MAX_PARAMS
        assert 2 * t.param_count(c) < 30e6


def test_a_candidate_over_the_size_limit_is_refused(prep, tmp_path):
    r = _sweep(prep, tmp_path / "big", "--max-params", "20000", check=False)
    assert r.returncode != 0
    assert "over --max-params" in r.stderr and "2x32x64/2/1" in r.stderr
    assert not (tmp_path / "big" / "model.safetensors").exists()


def test_a_malformed_candidate_is_a_usage_error(prep, tmp_path):
    r = _run("sweep", "--prep", str(prep), "--out", str(tmp_path / "x"), "--candidates",
             "2x30x64/4/1", check=False)
    assert r.returncode == 2 and "hidden divisible by heads" in r.stderr
    r = _run("sweep", "--prep", str(prep), "--out", str(tmp_path / "x"), "--candidates", "2x32",
             check=False)
    assert r.returncode == 2 and "LAYERSxHIDDENxINTERMEDIATE" in r.stderr


def _eval_fixture() -> dict:
    def row(header, body, finish, parses, old, **kw):
        return {"header": header, "body": body, "finish": finish, "parses": parses,
                "error": None if parses else "unterminated string literal (line 2)",
                "lines": body.count("\n"), "old_parses": old, **kw}

    return {
        "machine": "a test machine", "command": "tidegate eval code --model M --json eval.json",
        "bpb": {"files": 3, "scope": "3 of 9, evenly spaced", "bits_per_byte": 0.812345,
                "gzip9_bits_per_byte": 2.25, "xz9_bits_per_byte": 2.2, "ppl": 7.5,
                "tokens": 12345},
        "fim": {"exact": 3, "total": 32, "exact_ignoring_whitespace": 5,
                "mean_line_similarity": 0.4567, "token_accuracy": 0.6789, "tokens_scored": 400,
                "stopped_with_eos": 30, "copies_a_neighbour": 2, "max_tokens": 32,
                "definition": "one line removed"},
        "headers": {"parsed": 1, "total": 2, "parsed_and_finished": 1, "parsed_old_protocol": 0,
                    "definition": "greedy, 256 tokens, HumanEval-style stop",
                    "old_definition": "greedy, 64 tokens",
                    "rows": [row("def gcd(a, b):", "\n    return a | b\n", "dedent", True, False),
                             row("def f(x):", '\n    """\n    >>> f(1)\n' * 15, "length",
                                 False, False)]},
        "heldout_headers": {"parsed": 1, "total": 1, "parsed_and_finished": 0,
                            "parsed_old_protocol": 1, "definition": "d", "old_definition": "o",
                            "rows": [row("    def size(self) -> int:", "\n        return 1\n",
                                         "stop string", True, True,
                                         path="site-packages/pkg_h/m1.py", function="size")]},
        "speed": {"value": "86.1 tokens/s", "note": "tidegate eval speed"},
    }


def test_card_renders_the_engine_section_from_eval_json(swept):
    a, _ = swept
    (a / "eval.json").write_text(json.dumps(_eval_fixture()))
    _run("card", "--model", str(a))
    card = (a / "README.md").read_text(encoding="utf-8")
    engine = card[card.index("### Through tidegate's engine"):]
    assert "tidegate eval code --model M --json eval.json" in engine
    assert "**0.812345** (gzip -9 2.2500, xz -9 2.2000; 0.361 × gzip)" in engine
    assert "exact line **3/32**" in engine and "ignoring all whitespace 5/32" in engine
    assert "mean edit similarity of the line 0.457" in engine
    assert "token accuracy of the removed line **0.679** (400 tokens" in engine
    assert "30/32 middles closed" in engine and "2/32 repeat the line" in engine
    assert "**1/2** (1 of them ended within the budget)" in engine
    assert "same, old protocol (greedy, 64 tokens) | 0/2" in engine
    assert "signature lines of 1 held-out functions (listed below) | 1/1 parse" in engine
    assert "| 86.1 tokens/s (tidegate eval speed) |" in engine
    # every header is a row, pipes escaped; the file of a held-out header is shown
    assert "| `def gcd(a, b):` | dedent | 2 | **parses** | fails |" in engine
    assert "fails: unterminated string literal (line 2)" in engine
    assert "| `def size(self) -> int:` | `pkg_h/m1.py` | stop string |" in engine
    # the digest: the parsing completion in full, the failing one cut at 20 lines
    assert "```python\ndef gcd(a, b):\n    return a | b\n```" in engine
    assert "# ... 25 more lines" in engine
    # the sweep is in the card: every candidate, the winner in bold, the sweep command
    sw = json.loads((a / "metrics.json").read_text())["sweep"]
    for c in sw["candidates"]:
        assert f"{c['val_loss']:.4f}" in card
    assert f"**{sw['winner']}**" in card
    assert "python -m training.train sweep --prep PREP" in card
    assert "No validation-loss sweep" not in card


def test_the_gpu_call_script_runs_end_to_end_on_the_cpu(prep, tmp_path, request):
    """scripts/gpu_tiny_coder_run.sh's plumbing (the lead has one call to get it right): an xz
    corpus and a carried tokenizer in; the model directory back in <= 15 MiB parts, its metrics,
    and the engine's evaluation of it (greedy and at its generation_config.json defaults) on the
    held-out files rebuilt from the carried corpus; 8 files at most (the device tool's limit)."""
    import lzma
    import shutil
    import tarfile

    carry = tmp_path / "carry"
    (carry / "corpus").mkdir(parents=True)
    raw = (prep.parent / "corpus" / "corpus.jsonl").read_bytes()
    (carry / "corpus" / "corpus.jsonl.xz").write_bytes(lzma.compress(raw))
    shutil.copy(prep / "tokenizer.json", carry / "tokenizer.json")  # TOKENIZER= below
    # The script's scratch is its TMPDIR, where prepare's forkserver binds a Unix socket: a path
    # of at most 107 bytes, which a pytest-xdist worker's tmp_path (.../popen-gw0/...) can pass.
    out, scratch = tmp_path / "out", Path(tempfile.mkdtemp(prefix="tc-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OUT": str(out),
           "CARRY": str(carry), "TOKENIZER": str(carry / "tokenizer.json"), "TMPDIR": str(scratch), "COMPILE": "", "EVAL_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "PREPARE_ARGS": "--workers 2",
           "TRAIN_ARGS": "--device cpu --steps 6 --seq-len 32 --batch-size 2 --warmup-steps 2 "
                         "--eval-every 4 --sample-tokens 4 --layers 1 --hidden-size 32 "
                         "--intermediate-size 64 --heads 2 --kv-heads 1 --eval-batch-size 16",
           "EVAL_ARGS": "--files-sample 1 --fim-cases 2 --heldout-headers 1"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_tiny_coder_run.sh")], env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "prepare exit 0" in r.stdout and "train exit 0" in r.stdout, r.stdout[-3000:]
    assert "eval (none) exit 0" in r.stdout and "eval (auto) exit 0" in r.stdout, r.stdout[-4000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir()), files
    parts = sorted(out.glob("tiny-coder.tar.part-*"))
    assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts)
    back = tmp_path / "back"
    (tmp_path / "model.tar").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(tmp_path / "model.tar") as tf:
        tf.extractall(back, filter="data")
    model = back / "tiny-coder"
    m = json.loads((model / "metrics.json").read_text())
    assert m["sweep"] is None and m["model_config"]["num_hidden_layers"] == 1
    assert m["prep"]["function_doc_rate"] == 1.0 and m["prep"]["function_documents"] > 0
    assert m["prep"]["function_nodoc_rate"] == 0.5
    assert m["prep"]["function_documents_without_docstring"] > 0
    # shipped int8 (backend.model.int8); the trainer measured the same rounding on all held-out
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "tidegate-int8"
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "I8"
    assert m["heldout_int8"]["bits_per_byte"] > 0
    assert "int8 as shipped" in (model / "README.md").read_text()
    gen = json.loads((model / "generation_config.json").read_text())
    assert gen["temperature"] == 0.0 and gen["frequency_penalty"] > 0.0
    assert "repetition_penalty" not in gen  # it would penalize a FIM prompt's own names
    assert json.loads((out / "metrics.json").read_text()) == m
    log = (out / "log.txt").read_text()
    assert "eval (none) exit 0" in log and "held-out with int8 weights" in log
    greedy = json.loads((out / "eval.json").read_text())
    defaults = json.loads((out / "eval_defaults.json").read_text())
    assert greedy["decoding"]["sampling"] == "greedy"
    assert defaults["decoding"]["frequency_penalty"] == gen["frequency_penalty"]
    assert greedy["bpb"]["files"] == 1 and "bpb" not in defaults
    for ev in (greedy, defaults):
        assert ev["fim"]["total"] == 2
        assert ev["headers"]["total"] == 8 and ev["heldout_headers"]["total"] == 1


def test_max_epochs_caps_the_steps_the_budget_would_fit(prep, tmp_path):
    """`--max-epochs` (issue 36, v4's schedule sized to its data): with a budget that fits far
    more steps than E passes over the stream, the run stops after E passes (its schedule sized
    to them); without it, the budget decides."""
    stream = int(__import__("numpy").load(prep / "train.npy").shape[0])
    common = ("train", "--prep", str(prep), "--device", "cpu", "--time-budget-s", "20",
              "--probe-steps", "6", "--probe-skip", "2", "--batch-size", "2", "--seq-len", "32",
              "--warmup-steps", "1", "--eval-every", "4", "--eval-windows", "2",
              "--eval-batch-size", "4", "--sample-tokens", "2", "--layers", "1",
              "--hidden-size", "32", "--intermediate-size", "64", "--heads", "2",
              "--kv-heads", "1", "--tie-embeddings")
    cap = int(0.05 * stream / 64)
    assert cap > 6  # past the probe, so the cap is what ends the run
    r = _run(*common, "--out", str(tmp_path / "capped"), "--max-epochs", "0.05")
    m = json.loads((tmp_path / "capped" / "metrics.json").read_text())
    assert m["steps"] == cap and m["total_steps"] == cap, (m["steps"], cap, r.stdout[-1500:])
    assert "--max-epochs 0.05" in r.stdout
    assert m["hyperparameters"]["max_epochs"] == 0.05


def test_prepare_records_each_validation_and_heldout_files_compressed_sizes_in_order(prep):
    """v5: `prepare` computes the gzip -9 / xz -9 sizes in threads; each file's record still
    holds its own sizes, in the corpus's order."""
    train = _trainer()
    texts = {"val": [], "heldout": []}
    for line in (prep.parent / "corpus" / "corpus.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["split"] in texts:
            texts[r["split"]].append((r["path"], r["text"]))
    for split, files in texts.items():
        rec = json.loads((prep / f"{split}_files.json").read_text())
        assert [x["path"] for x in rec] == [p for p, _ in files]
        for x, (_, t) in zip(rec, files):
            c = train.compressed_bits(t)
            assert (x["gzip9"], x["xz9"]) == (c["gzip9"], c["xz9"])
