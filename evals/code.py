"""`tidegate eval code`: what a code model has learned, through our engine.

    tidegate eval code --model models/tiny-coder [--files-sample 40] [--fim-cases 64] [--json out]

Three measurements on the held-out packages (the model directory's `heldout_files.txt`, paths
`site-packages/...` looked up in this environment's site-packages, see `evals.data`):

**bits per byte** (comparable across tokenizers): every held-out file (or `--files-sample N`
of them, evenly spaced over the list) is `<bos> text <eos>`, cut into windows of `--chunk-len`
predicted tokens with the context restarting at each window (the training script's protocol);
every token after `<bos>` is predicted once, `<eos>` included. bits/byte = sum NLL / ln 2 /
UTF-8 bytes of the texts. Beside it, the same files compressed one by one with `gzip -9 -n`
and `xz -9` (Python's `gzip`/`lzma` at the same settings), in bits per byte of the same text.

**FIM lines**: functions of the held-out files (ast `FunctionDef`s of 4-40 lines),
`--fim-cases` of them evenly spaced over all found; in each, one single-line statement of its
body (chosen by a seeded RNG) is removed. The prompt is the model's fill-in-the-middle format,
token for token what `training/train.py` trained on (prefix-suffix-middle order, each
text tokenized on its own between the special tokens, which the tokenizer matches first):
`<bos><fim_begin>{function before the line}<fim_hole>{function after the line}<fim_end>`;
the greedy continuation (at most `--fim-max-tokens`) is cut at `<eos>` and its first line is
compared with the removed one (`evals.completion`): exactly (indentation included,
trailing spaces ignored), ignoring all whitespace, and as an edit similarity. Beside them, the
teacher-forced token accuracy of the removed line: fed the prompt and the line's true tokens
(the line, its newline and the closing `<eos>`, as trained), the share of those tokens the model
ranks first. Needs the tokenizer's FIM special tokens (DeepSeek-Coder's names).

**Header completions** (HumanEval-style, `evals.completion`): each of HEADERS, and the
signature lines of `--heldout-headers` held-out functions, completed greedily with 256 new
tokens, cut at `<eos>`, a stop string or the first line back at the header's indentation; it
counts when the header + that completion parses (reported too: how many of those ended before
the budget, since a loop of whole lines cut by it can parse). The old protocol's figure (64 tokens, cut at the
last complete line and the first dedent to column 0) is computed from the first 64 tokens of the
same greedy run and reported beside it.
"""
from __future__ import annotations

import dataclasses
import gzip
import lzma
import math
import sys
import time
from pathlib import Path

from evals.completion import (
    HEADER_TOKENS,
    OLD_HEADER_TOKENS,
    first_line,
    function_snippet,
    judge_header,
    line_exact,
    line_exact_ignoring_whitespace,
    line_similarity,
    parse_error,
)
from evals.data import (
    FimCase,
    default_heldout_list,
    encode_docs,
    fim_cases,
    heldout_headers,
    load_heldout,
    make_windows,
    spaced_indices,
)
from evals.engine import (
    EngineSettings,
    EngineShape,
    EvalError,
    build_engine,
    greedy_decode,
    score_all_rows,
    synchronize,
)

FIM_BEGIN, FIM_HOLE, FIM_END = "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"
HEADERS = [
    "def fibonacci(n):",
    "def is_prime(n):",
    "def factorial(n):",
    "def reverse_string(s):",
    "def read_lines(path):",
    "def flatten(items):",
    "def gcd(a, b):",
    "def binary_search(items, target):",
]
HELDOUT_HEADERS = 8


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[eval code] {msg}", file=sys.stderr, flush=True)


# ---- compressors ----------------------------------------------------------------------------

def compressed_bits(text: str) -> dict[str, int]:
    """Bits of `gzip -9 -n` (no name, mtime 0) and `xz -9` of one text."""
    raw = text.encode("utf-8")
    return {"gzip9": 8 * len(gzip.compress(raw, compresslevel=9, mtime=0)),
            "xz9": 8 * len(lzma.compress(raw, preset=9))}


# ---- bits per byte --------------------------------------------------------------------------

def bits_per_byte(engine, tokenizer, files: list[tuple[str, str]], window: int,
                  progress: bool = False) -> dict:
    """Held-out bits per byte of `files` [(path, text)] through `engine` (module docstring)."""
    import torch

    docs = encode_docs(tokenizer, [t for _, t in files])
    requests, targets = [], {}
    for fi, doc in enumerate(docs):
        for wi, (x, y) in enumerate(make_windows(doc, window)):
            rid = f"f{fi}w{wi}"
            requests.append((rid, x))
            targets[rid] = torch.tensor(y, dtype=torch.long, device=engine.runner.device)
    acc = {"nll": 0.0, "n": 0}

    def on_rows(rid: str, start: int, logits) -> None:
        y = targets[rid][start:start + logits.shape[0]]
        acc["nll"] += float(torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum"))
        acc["n"] += int(y.numel())

    t0 = time.perf_counter()
    score_all_rows(engine, requests, on_rows, next_token=lambda rid: int(targets[rid][-1]),
                   on_step=lambda: _say(progress and acc["n"] % 20 == 0, f"{acc['n']:,} tokens"))
    synchronize(engine)
    nbytes = sum(len(t.encode("utf-8")) for _, t in files)
    comp = [compressed_bits(t) for _, t in files]
    bits = acc["nll"] / math.log(2)
    return {
        "files": len(files), "bytes": nbytes, "tokens": acc["n"], "windows": len(requests),
        "window": window, "bits_per_byte": bits / nbytes, "nll": acc["nll"] / acc["n"],
        "ppl": math.exp(acc["nll"] / acc["n"]),
        "gzip9_bits_per_byte": sum(c["gzip9"] for c in comp) / nbytes,
        "xz9_bits_per_byte": sum(c["xz9"] for c in comp) / nbytes,
        "seconds": time.perf_counter() - t0,
    }


# ---- FIM lines --------------------------------------------------------------------------------

def fim_prompt(case: FimCase) -> str:
    return f"{FIM_BEGIN}{case.prefix}{FIM_HOLE}{case.suffix}{FIM_END}"


def _last_line(text: str) -> str:
    lines = text.rstrip("\n").rsplit("\n", 1)
    return lines[-1].strip()


def fim_lines(engine, tokenizer, cases: list[FimCase], max_tokens: int, params=None) -> dict:
    """Greedy middles against the removed lines, and the teacher-forced token accuracy of the
    removed lines (module docstring). `params`: the decoding (default greedy), as in
    `evals.engine.greedy_decode`; the teacher-forced accuracy is always the plain argmax."""
    for t in (FIM_BEGIN, FIM_HOLE, FIM_END):
        if tokenizer.tokenizer.token_to_id(t) is None:
            raise EvalError(f"the tokenizer has no {t} token: the model was not trained for FIM")
    prompts = [tokenizer.encode(fim_prompt(c)) for c in cases]
    outs = greedy_decode(engine, prompts, max_tokens, params=params)
    eos = set(tokenizer.eos_token_ids)
    # the middle as it was trained: its own tokens (line + newline), then <eos>
    truth = [tokenizer.encode(c.middle + "\n", add_special_tokens=False)
             + list(tokenizer.eos_token_ids[:1]) for c in cases]
    width = max(map(len, truth))
    forced = [t + [t[-1]] * (width - len(t)) for t in truth]  # padding is fed, never scored
    ranked_first = greedy_decode(engine, prompts, width, forced=forced)
    exact = loose = stopped = copied = 0
    similarity, shown = [], []
    for c, ids in zip(cases, outs):
        cut = next((k for k, t in enumerate(ids) if t in eos), len(ids))
        stopped += cut < len(ids)
        got = first_line(tokenizer.decode(ids[:cut], skip_special_tokens=True))
        ok = line_exact(got, c.middle)
        exact += ok
        loose += line_exact_ignoring_whitespace(got, c.middle)
        similarity.append(line_similarity(got, c.middle))
        # the commonest miss of a small FIM model: repeating the line just before or after
        neighbour = got.strip() and got.strip() in (_last_line(c.prefix), first_line(c.suffix).strip())
        copied += bool(neighbour)
        shown.append({"path": c.path, "function": c.function, "expected": c.middle,
                      "got": got, "match": ok, "similarity": round(similarity[-1], 3),
                      "copies_a_neighbour": bool(neighbour)})
    hits = sum(int(p == t) for tr, pr in zip(truth, ranked_first) for p, t in zip(pr, tr))
    n_truth = sum(map(len, truth))
    return {"exact": exact, "total": len(cases), "rate": exact / max(1, len(cases)),
            "exact_ignoring_whitespace": loose,
            "mean_line_similarity": sum(similarity) / max(1, len(similarity)),
            "token_accuracy": hits / max(1, n_truth), "tokens_scored": n_truth,
            "stopped_with_eos": stopped, "copies_a_neighbour": copied,
            "max_tokens": max_tokens, "cases": shown,
            "definition": "one single-line statement removed from a held-out function of 4-40 "
                          "lines; greedy middle up to eos/newline equals it (indentation "
                          "included, trailing spaces ignored)"}


# ---- header completions -----------------------------------------------------------------------

def header_completions(engine, tokenizer, headers: list[str] = HEADERS,
                       max_tokens: int = HEADER_TOKENS,
                       old_tokens: int = OLD_HEADER_TOKENS, params=None) -> dict:
    """Greedy completions of `headers` judged HumanEval-style, with the old protocol's verdict
    on the first `old_tokens` tokens of the same greedy run (module docstring). `params`: the
    decoding (default greedy), as in `evals.engine.greedy_decode`."""
    outs = greedy_decode(engine, [tokenizer.encode(h) for h in headers], max_tokens,
                         params=params)
    eos = set(tokenizer.eos_token_ids)
    rows = []
    for h, ids in zip(headers, outs):
        cut = next((k for k, t in enumerate(ids) if t in eos), None)
        text = tokenizer.decode(ids[:cut] if cut is not None else ids, skip_special_tokens=True)
        row = {"header": h, **judge_header(h, text, cut is not None)}
        row["lines"] = row["body"].count("\n")
        old_stop = cut is not None and cut < old_tokens
        old_text = tokenizer.decode(ids[:cut] if old_stop else ids[:old_tokens],
                                    skip_special_tokens=True)
        row["old_parses"] = parse_error(function_snippet(
            h, old_text, "stop" if old_stop else "length")) is None
        rows.append(row)
    return {"parsed": sum(r["parses"] for r in rows), "total": len(rows),
            # a function cut by the budget can still parse (a loop of whole lines)
            "parsed_and_finished": sum(r["parses"] and r["finish"] != "length" for r in rows),
            "parsed_old_protocol": sum(r["old_parses"] for r in rows), "rows": rows,
            "max_tokens": max_tokens,
            "definition": f"greedy, {max_tokens} tokens, cut at eos, a stop string or the first "
                          "line back at the header's indentation; ast.parse of header + that",
            "old_definition": f"greedy, {old_tokens} tokens; ast.parse of the function cut at "
                              "its last complete line and at the first dedent to column 0"}


# ---- the command --------------------------------------------------------------------------------

def decoding_params(generation_config: str, model: str):
    """(SamplingParams or None for greedy, what it is as a dict) for `--generation-config`: the
    sampling defaults the server would apply to a request that sets none of them
    (`backend.model.generation_config`); the evaluation's token budgets are kept."""
    from backend.model.generation_config import load_generation_defaults
    from backend.runner.sampler import SamplingParams

    defaults = load_generation_defaults(generation_config, model)
    defaults.pop("max_tokens", None)
    if not defaults:
        return None, {"generation_config": generation_config, "sampling": "greedy"}
    kw = {k: (int(v) if k == "top_k" else v) for k, v in defaults.items()}
    kw.setdefault("temperature", 1.0)  # the API's default for a field the file leaves out
    return SamplingParams(seed=0, **kw), {"generation_config": generation_config, **kw}


def run(model: str, settings: EngineSettings, shape: EngineShape | None = None, *,
        window: int = 1024, files_sample: int | None = None, fim_n: int = 64,
        fim_max_tokens: int = 32, heldout_list: str | Path | None = None,
        site_root: str | Path | None = None, stdlib_root: str | Path | None = None,
        seed: int = 0, parts: tuple[str, ...] = ("bpb", "fim", "headers"),
        heldout_header_n: int = HELDOUT_HEADERS, generation_config: str = "none",
        progress: bool = True) -> dict:
    shape = shape or EngineShape()
    params, decoding = decoding_params(generation_config, model)
    heldout = load_heldout(heldout_list or default_heldout_list(model), stdlib_root,
                           site_root=site_root)
    if not heldout.files:
        raise EvalError(f"no held-out file found: {heldout.describe()}")
    files = heldout.files
    if files_sample is not None and files_sample < len(files):
        files = [files[i] for i in spaced_indices(len(files), files_sample)]
    t0 = time.perf_counter()
    engine, loaded = build_engine(model, settings, dataclasses.replace(shape, max_model_len=max(
        window + 1, 2048)))
    tok = loaded.tokenizer
    report: dict = {"model": model, "settings": settings.as_dict(), "heldout": heldout.describe(),
                    "decoding": decoding, "load_seconds": time.perf_counter() - t0}
    if "bpb" in parts:
        _say(progress, f"bits per byte: {len(files)} of {len(heldout.files)} files")
        r = bits_per_byte(engine, tok, files, window, progress)
        r["scope"] = ("all" if len(files) == len(heldout.files)
                      else f"{len(files)} of {len(heldout.files)}, evenly spaced")
        report["bpb"] = r
        _say(progress, f"bits per byte {r['bits_per_byte']:.4f} (gzip -9 "
                       f"{r['gzip9_bits_per_byte']:.4f}, xz -9 {r['xz9_bits_per_byte']:.4f})")
    if "fim" in parts:
        cases = fim_cases(heldout.files, fim_n, seed)
        _say(progress, f"FIM: {len(cases)} cases")
        report["fim"] = f = fim_lines(engine, tok, cases, fim_max_tokens, params)
        _say(progress, f"FIM exact line {f['exact']}/{f['total']}, ignoring whitespace "
                       f"{f['exact_ignoring_whitespace']}, token accuracy {f['token_accuracy']:.3f}")
    if "headers" in parts:
        report["headers"] = h = header_completions(engine, tok, params=params)
        _say(progress, f"headers parsed {h['parsed']}/{h['total']} (old protocol "
                       f"{h['parsed_old_protocol']})")
        chosen = heldout_headers(heldout.files, heldout_header_n) if heldout_header_n else []
        if chosen:
            r = header_completions(engine, tok, [c["header"] for c in chosen], params=params)
            for row, c in zip(r["rows"], chosen):
                row.update(path=c["path"], function=c["function"])
            report["heldout_headers"] = r
            _say(progress, f"held-out headers parsed {r['parsed']}/{r['total']} (old protocol "
                           f"{r['parsed_old_protocol']})")
    report["seconds"] = time.perf_counter() - t0
    return report
