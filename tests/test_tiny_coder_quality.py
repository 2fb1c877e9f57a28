"""models/tiny-coder through our engine: exact logits, held-out bits per byte, FIM, greedy
agreement, and code completion through the embedded gateway (CPU; a few minutes).

(a) Logits. Our engine's float32 logits for a held-out snippet match transformers'
    `LlamaForCausalLM` within 1e-4 *relative*: max |ours - hf| <= 1e-4 * max |hf| over the
    compared rows. Checked for every row of a chunked prefill (the scheduler cuts it under a
    96-token budget, later chunks read the earlier ones from the paged KV cache) and for the
    rows of decode steps (teacher-forced, `runner.execute(keep_logits=True)`).

(b) Bits per byte. `tidegate eval code --files-sample 8` (8 of the 198 held-out files of the
    held-out packages, evenly spaced over the list; see evals/code.py) must be at most
    GZIP_FACTOR (0.6, the issue's goal) x gzip -9 of the same 8 files, and within BPB_TOLERANCE
    (25%) of the training script's figure over all 198 files (metrics.json: 0.7889 int8, v4;
    measured on the 8: 0.7751 against gzip -9 2.3123; v3: 0.8603 and 0.8412; v2: 0.8242 and
    0.8065). The random `tiny` preset
    scores ~8 bits/byte.

(c) FIM. 16 held-out functions with one single-line statement removed, prompted in the
    DeepSeek-Coder FIM format (token for token the training documents' format): the model must
    close the middle with <|eos|> within 32 tokens in at least FIM_MIN_STOPPED of them (it
    learned the format). Exact-line matches and the softer figures are printed, not required:
    on `tidegate eval code --fim-cases 32` v4 measured 7 of 32 exact, line similarity 0.585,
    token accuracy 0.746, 31 closed with <|eos|> (v3: 7, 0.618, 0.706, 32; v2: 0 of 32, 0.367,
    0.60, 28).

(d) Agreement. `agreement` of float32 with itself is exactly 1.0; float32 vs bfloat16
    weights/activations (teacher-forced on the float32 tokens) is >= 0.9.

(e) Completion. `tidegate serve` with no model (the embedded default: models/tiny-coder on the
    CPU) completes HEADERS greedily as a code-completion client would (HumanEval-style:
    max_tokens 256, the API's `stop` = the usual stop strings); a completion counts when
    `evals.completion.judge_header` parses it (cut at the first line back at the
    header's indentation). The request sets temperature 0 and no penalty, so the model's
    generation_config.json penalty (frequency 0.8 since the v4 re-choice; repetition 1.1 +
    frequency 0.4 before) applies: v4 measured 5/8 here and at the defaults (test below), 5/8
    through the float32 engine at the defaults, and 3/8 there with no penalty at all
    (`tidegate eval code`). `fibonacci` and `gcd` fail at every decoding (numba-cuda's libdevice
    docstring, closed at column 0). The issue's goal is on the held-out headers (last test:
    8/8). v3: 7/8 here; v2: 2/8, its failures doctest docstrings that looped to the budget.
    Required: >= MIN_PARSED. The rule itself is pinned in tests/test_eval_completion.py.
"""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from serve_helpers import serving

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-coder"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (MODEL / "model.safetensors").is_file(),
                       reason="models/tiny-coder is not in this checkout"),
]

SAMPLE_FILES = 8
GZIP_FACTOR = 0.6
BPB_TOLERANCE = 0.25
FIM_CASES = 16
FIM_MIN_STOPPED = 8
# v4 (issue 36) at its defaults (frequency 0.8) measured 5/8 fixed headers in both tests through
# `make serve` (bf16; `fibonacci`, `gcd`, `binary_search` fail) and 5/8 through the float32
# engine, where the held-out headers parse 8/8 and none of the 16 runs to the budget. The pins:
# the fixed headers as measured (the 8 are generic prompts, not the goal), the held-out
# ones at the goal, >= 7/8 and none to the budget.
# v3: 7/8 and 7/8 at repetition 1.1 + frequency 0.4 (pins 7); v2: 1 (2/8 greedy) and 6.
MIN_PARSED = 5
MIN_PARSED_DEFAULTS = 5
MIN_HELDOUT_PARSED_DEFAULTS = 7


def metrics() -> dict:
    return json.loads((MODEL / "metrics.json").read_text())


# ---- (a) logits against transformers -------------------------------------------------------------

def transformers_dir(tmp_path: Path) -> Path:
    """The model as transformers reads it: the directory itself, or for an int8 checkpoint
    (backend.model.int8) its float32 dequantization -- the weights our loader computes."""
    from backend.model import int8

    if int8.checkpoint_method(json.loads((MODEL / "config.json").read_text())) != "int8":
        return MODEL
    int8.dequantize_checkpoint(MODEL, tmp_path / "float32", "float32")
    return tmp_path / "float32"


def test_logits_match_transformers(tmp_path):
    from transformers import LlamaForCausalLM

    from evals.data import default_heldout_list, encode_doc, load_heldout
    from evals.engine import (
        EngineSettings,
        EngineShape,
        build_engine,
        greedy_decode,
        sequence_logits,
    )

    engine, loaded = build_engine(str(MODEL), EngineSettings(dtype="float32"),
                                  EngineShape(max_num_batched_tokens=96))
    heldout = load_heldout(default_heldout_list(str(MODEL)), max_files=3)
    doc = encode_doc(loaded.tokenizer, heldout.files[-1][1])
    prompt, forced = doc[:200], doc[200:216]
    ours = sequence_logits(engine, prompt + forced)  # 216 rows: chunks of 96, 96, 24
    decode_rows = torch.empty((len(forced), ours.shape[1]))

    def keep(i, t, row):
        decode_rows[t] = row.cpu()

    greedy_decode(engine, [prompt], len(forced), forced=[forced], on_logits=keep)
    hf = LlamaForCausalLM.from_pretrained(transformers_dir(tmp_path), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + forced])).logits[0].float()
    scale = ref.abs().max()
    assert (ours - ref).abs().max() <= 1e-4 * scale
    # decode row t predicts position len(prompt) + t: hf row len(prompt) - 1 + t
    ref_dec = ref[len(prompt) - 1:len(prompt) - 1 + len(forced)]
    assert (decode_rows - ref_dec).abs().max() <= 1e-4 * scale
    engine.check_integrity()


# ---- (b) held-out bits per byte, FIM ---------------------------------------------------------

def test_heldout_bits_per_byte_beats_gzip():
    from evals import code as eval_code
    from evals.engine import EngineSettings

    ho = metrics()["heldout"]
    r = eval_code.run(str(MODEL), EngineSettings(dtype="float32"), files_sample=SAMPLE_FILES,
                      parts=("bpb",), progress=False)["bpb"]
    print(f"\ntiny-coder held-out bits/byte, {r['files']} spaced files: {r['bits_per_byte']:.4f} "
          f"(gzip -9 {r['gzip9_bits_per_byte']:.4f}, xz -9 {r['xz9_bits_per_byte']:.4f}); "
          f"training, all files: {ho['bits_per_byte']:.4f}")
    assert r["files"] == SAMPLE_FILES and r["tokens"] > 10_000
    assert r["bits_per_byte"] <= GZIP_FACTOR * r["gzip9_bits_per_byte"]
    assert abs(r["bits_per_byte"] - ho["bits_per_byte"]) <= BPB_TOLERANCE * ho["bits_per_byte"]
    # random weights (the byte-level `tiny` preset) predict ~uniformly over 259 ids: ~8 bits/byte
    # (on the first 1,000 characters of one held-out file: its tokens are bytes, and many)
    from evals.data import default_heldout_list, load_heldout
    from evals.engine import EngineShape, build_engine

    path, text = load_heldout(default_heldout_list(str(MODEL)), max_files=1).files[0]
    engine, loaded = build_engine("tiny", EngineSettings(), EngineShape(max_model_len=1100))
    rnd = eval_code.bits_per_byte(engine, loaded.tokenizer, [(path, text[:1000])], window=1024)
    assert rnd["bits_per_byte"] > 7.0


def test_fim_exact_line():
    from evals import code as eval_code
    from evals.engine import EngineSettings

    r = eval_code.run(str(MODEL), EngineSettings(dtype="float32"), fim_n=FIM_CASES,
                      parts=("fim",), progress=False)["fim"]
    print(f"\nFIM exact line {r['exact']}/{r['total']}, ignoring whitespace "
          f"{r['exact_ignoring_whitespace']}, line similarity {r['mean_line_similarity']:.3f}, "
          f"token accuracy {r['token_accuracy']:.3f}, stopped with eos {r['stopped_with_eos']}")
    assert r["total"] == FIM_CASES
    assert r["stopped_with_eos"] >= FIM_MIN_STOPPED


# ---- (c) agreement -------------------------------------------------------------------------------

def test_agreement_self_and_bfloat16():
    from evals import cli as ev
    from evals.engine import EngineSettings

    f32, bf16 = EngineSettings(dtype="float32"), EngineSettings(dtype="bfloat16")
    kw = {"num_prompts": 8, "prompt_len": 64, "max_tokens": 16, "progress": False}
    same = ev.agreement(str(MODEL), f32, f32, **kw)
    assert same["agreement"] == 1.0 and same["exact_continuations"] == 1.0
    mixed = ev.agreement(str(MODEL), f32, bf16, **kw)
    print(f"\nagreement float32 vs bfloat16: {mixed['agreement']:.4f} "
          f"over {mixed['positions']} positions")
    assert mixed["agreement"] >= 0.9


# ---- (d) completions through the embedded gateway ------------------------------------------------

@pytest.fixture(scope="module")
def gateway():
    with serving() as s:
        yield s


def complete(url: str, model: str, prompt: str) -> dict:
    from evals.completion import HEADER_TOKENS, STOP_STRINGS

    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": HEADER_TOKENS,
                       "stop": list(STOP_STRINGS), "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())["choices"][0]


def test_embedded_default_completes_parsable_functions(gateway):
    from evals.code import HEADERS
    from evals.completion import judge_header

    assert gateway["model"] == "tiny-coder"  # the embedded default picked the trained model
    with ThreadPoolExecutor(len(HEADERS)) as pool:
        choices = list(pool.map(lambda h: complete(gateway["url"], gateway["model"], h), HEADERS))
    ok = [judge_header(h, c["text"], c["finish_reason"] == "stop")["parses"]
          for h, c in zip(HEADERS, choices)]
    rate = sum(ok) / len(ok)
    print(f"\nparse rate {sum(ok)}/{len(ok)} = {rate:.2f}; failed: "
          f"{[h for h, good in zip(HEADERS, ok) if not good]}")
    assert sum(ok) >= MIN_PARSED, [(h, c["text"]) for h, c in zip(HEADERS, choices)]


def test_embedded_default_decoding_completes_functions(gateway):
    """The same headers at the server's default decoding for this model: no sampling field in
    the request, so the model's generation_config.json applies (greedy, frequency_penalty 0.8;
    `--generation-config auto`, issue 36). Every completion must be deterministic (greedy) and
    at least MIN_PARSED_DEFAULTS must parse."""
    from evals.code import HEADERS
    from evals.completion import judge_header

    def complete_default(prompt: str) -> dict:
        return _complete_at_defaults(gateway, prompt)

    with ThreadPoolExecutor(len(HEADERS)) as pool:
        choices = list(pool.map(complete_default, HEADERS))
    again = complete_default(HEADERS[0])
    assert again["text"] == choices[0]["text"]  # temperature 0 from the file, not the API's 1
    ok = [judge_header(h, c["text"], c["finish_reason"] == "stop")["parses"]
          for h, c in zip(HEADERS, choices)]
    print(f"\nat the model's defaults: parse rate {sum(ok)}/{len(ok)}")
    assert sum(ok) >= MIN_PARSED_DEFAULTS, [(h, c["text"]) for h, c in zip(HEADERS, choices)]


def test_embedded_default_fills_the_middle(gateway):
    """The API's `suffix` works on the shipped model: its tokenizer has DeepSeek-Coder's FIM
    tokens (a model without them gets a 400), and the greedy middle ends with <|eos|>."""
    body = json.dumps({"model": gateway["model"], "prompt": "def add(a, b):\n",
                       "suffix": "\n    return c\n", "max_tokens": 32,
                       "temperature": 0}).encode()
    req = urllib.request.Request(gateway["url"] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        choice = json.loads(resp.read())["choices"][0]
    print(f"\nFIM middle: {choice['text']!r} ({choice['finish_reason']})")
    assert choice["text"].strip()
    assert choice["finish_reason"] == "stop"



def test_embedded_default_decoding_completes_heldout_functions(gateway):
    """Issue 36's goal through `make serve`: the 8 held-out function headers that `tidegate eval
    code` judges (`evals.data.heldout_headers`: signature lines of held-out packages' functions,
    never trained on), completed at the server's default decoding for this model (no sampling
    field in the request: generation_config.json), HumanEval-style. At least
    MIN_HELDOUT_PARSED_DEFAULTS parse and none runs to the 256-token budget (no <eos>, stop
    string or end of the function within it)."""
    from evals.code import default_heldout_list
    from evals.completion import judge_header
    from evals.data import heldout_headers, load_heldout

    held = load_heldout(default_heldout_list(str(MODEL)))
    if not held.files:
        pytest.skip(f"held-out packages missing from this environment: {held.describe()}")
    headers = [c["header"] for c in heldout_headers(held.files, 8)]

    def complete_default(prompt: str) -> dict:
        return _complete_at_defaults(gateway, prompt)

    with ThreadPoolExecutor(len(headers)) as pool:
        choices = list(pool.map(complete_default, headers))
    verdicts = [judge_header(h, c["text"], c["finish_reason"] == "stop")
                for h, c in zip(headers, choices)]
    parsed = sum(v["parses"] for v in verdicts)
    ran = [h for h, v in zip(headers, verdicts) if v["finish"] == "length"]
    print(f"\nheld-out headers at the model's defaults: parse {parsed}/{len(headers)}, ran to the "
          f"budget: {ran}")
    assert parsed >= MIN_HELDOUT_PARSED_DEFAULTS, [(h, c["text"]) for h, c in zip(headers, choices)]
    assert not ran, [(h, c["text"]) for h, c in zip(headers, choices) if h in ran]


def _complete_at_defaults(gateway, prompt: str) -> dict:
    """One header completion through the gateway with no sampling field in the request (the
    model's generation_config.json applies), HumanEval-style: the eval's budget and stops."""
    from evals.completion import HEADER_TOKENS, STOP_STRINGS

    body = json.dumps({"model": gateway["model"], "prompt": prompt,
                       "max_tokens": HEADER_TOKENS, "stop": list(STOP_STRINGS)}).encode()
    req = urllib.request.Request(gateway["url"] + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())["choices"][0]
