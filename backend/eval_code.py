"""`tidegate eval code`: what a code model has learned, through our engine.

    tidegate eval code --model models/tiny-coder [--files-sample 40] [--fim-cases 64] [--json out]

Three measurements on the held-out packages (the model directory's `heldout_files.txt`, paths
`site-packages/...` looked up in this environment's site-packages, see `backend.eval_data`):

**bits per byte** (comparable across tokenizers): every held-out file (or `--files-sample N`
of them, evenly spaced over the list) is `<bos> text <eos>`, cut into windows of `--chunk-len`
predicted tokens with the context restarting at each window (the training script's protocol);
every token after `<bos>` is predicted once, `<eos>` included. bits/byte = sum NLL / ln 2 /
UTF-8 bytes of the texts. Beside it, the same files compressed one by one with `gzip -9 -n`
and `xz -9` (Python's `gzip`/`lzma` at the same settings), in bits per byte of the same text.

**FIM exact-line match**: functions of the held-out files (ast `FunctionDef`s of 4-40 lines),
`--fim-cases` of them evenly spaced over all found; in each, one single-line statement of its
body (chosen by a seeded RNG) is removed. The prompt is the model's fill-in-the-middle format
`<bos><fim_begin>{function before the line}<fim_hole>{function after the line}<fim_end>`;
the greedy continuation (at most `--fim-max-tokens`) is cut at `<eos>` or the first newline,
and it matches when it equals the removed line (indentation included, trailing spaces
ignored). Needs the tokenizer's FIM special tokens (DeepSeek-Coder's names).

**Header completions**: each of HEADERS is completed greedily (64 tokens, as the embedded
gateway would with temperature 0); the completion counts when `ast.parse` accepts
`function_snippet(header, completion, finish_reason)` (cut at the last complete line when the
64 tokens ran out, and at the first line that dedents to column 0).
"""
from __future__ import annotations

import ast
import dataclasses
import gzip
import lzma
import math
import random
import sys
import time
from pathlib import Path

from backend.eval_data import (
    default_heldout_list,
    encode_docs,
    load_heldout,
    make_windows,
    spaced_indices,
)
from backend.eval_engine import (
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
HEADER_TOKENS = 64


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


# ---- FIM exact-line match ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FimCase:
    path: str
    function: str
    prefix: str
    middle: str   # the removed line, without its newline
    suffix: str


def fim_cases(files: list[tuple[str, str]], n: int, seed: int = 0,
              min_lines: int = 4, max_lines: int = 40) -> list[FimCase]:
    """`n` cases from functions spaced over all usable functions of `files` (module docstring)."""
    funcs = []
    for path, text in files:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if not (min_lines <= node.end_lineno - first + 1 <= max_lines):
                continue
            # single-line statements of the body (any depth), not the docstring
            body_first = node.body[0]
            doc = (isinstance(body_first, ast.Expr) and isinstance(body_first.value, ast.Constant)
                   and isinstance(body_first.value.value, str))
            cands = sorted({s.lineno for s in ast.walk(node)
                            if isinstance(s, ast.stmt) and s is not node
                            and s.lineno == s.end_lineno and not (doc and s is body_first)
                            and lines[s.lineno - 1].strip()})
            if cands:
                funcs.append((path, node.name, first, node.end_lineno, cands, lines))
    if not funcs:
        return []
    out = []
    for i in spaced_indices(len(funcs), n):
        path, name, first, last, cands, lines = funcs[i]
        rng = random.Random(f"{seed}:{path}:{name}:{first}")
        ln = rng.choice(cands)
        out.append(FimCase(path=path, function=name,
                           prefix="".join(lines[first - 1:ln - 1]),
                           middle=lines[ln - 1].rstrip("\r\n"),
                           suffix="".join(lines[ln:last])))
    return out


def fim_prompt(case: FimCase) -> str:
    return f"{FIM_BEGIN}{case.prefix}{FIM_HOLE}{case.suffix}{FIM_END}"


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def fim_exact_line(engine, tokenizer, cases: list[FimCase], max_tokens: int,
                   examples: int = 3) -> dict:
    for t in (FIM_BEGIN, FIM_HOLE, FIM_END):
        if tokenizer.tokenizer.token_to_id(t) is None:
            raise EvalError(f"the tokenizer has no {t} token: the model was not trained for FIM")
    prompts = [tokenizer.encode(fim_prompt(c)) for c in cases]
    outs = greedy_decode(engine, prompts, max_tokens)
    eos = set(tokenizer.eos_token_ids)
    exact, stripped, stopped, shown = 0, 0, 0, []
    for c, ids in zip(cases, outs):
        cut = next((k for k, t in enumerate(ids) if t in eos), len(ids))
        stopped += cut < len(ids)
        got = first_line(tokenizer.decode(ids[:cut], skip_special_tokens=True))
        ok = got.rstrip() == c.middle.rstrip()
        exact += ok
        stripped += got.strip() == c.middle.strip()
        if len(shown) < examples:
            shown.append({"path": c.path, "function": c.function, "expected": c.middle,
                          "got": got, "match": ok})
    return {"exact": exact, "total": len(cases), "rate": exact / max(1, len(cases)),
            "exact_ignoring_indentation": stripped, "stopped_with_eos": stopped,
            "max_tokens": max_tokens, "examples": shown,
            "definition": "one single-line statement removed from a held-out function of 4-40 "
                          "lines; greedy middle up to eos/newline equals it (indentation "
                          "included, trailing spaces ignored)"}


# ---- header completions -----------------------------------------------------------------------

def function_snippet(header: str, completion: str, finish_reason: str | None) -> str:
    """header + completion, cut at the last complete line when the token budget ran out
    ("length") and at the first non-blank line (after the header's own) in column 0."""
    text = completion
    if finish_reason == "length":
        text = text[:text.rfind("\n") + 1] if "\n" in text else ""
    lines = text.split("\n")
    keep = lines[:1]  # the rest of the header's own line
    for line in lines[1:]:
        if line.strip() and not line[0].isspace():
            break
        keep.append(line)
    return header + "\n".join(keep)


def parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def header_completions(engine, tokenizer, headers: list[str] = HEADERS,
                       max_tokens: int = HEADER_TOKENS) -> dict:
    outs = greedy_decode(engine, [tokenizer.encode(h) for h in headers], max_tokens)
    eos = set(tokenizer.eos_token_ids)
    rows = []
    for h, ids in zip(headers, outs):
        cut = next((k for k, t in enumerate(ids) if t in eos), None)
        text = tokenizer.decode(ids[:cut] if cut is not None else ids, skip_special_tokens=True)
        finish = "stop" if cut is not None else "length"
        rows.append({"header": h, "completion": text, "finish_reason": finish,
                     "parses": parses(function_snippet(h, text, finish))})
    return {"parsed": sum(r["parses"] for r in rows), "total": len(rows), "rows": rows,
            "definition": f"greedy, {max_tokens} tokens; ast.parse of the function cut at its "
                          "last complete line and at the first dedent to column 0"}


# ---- the command --------------------------------------------------------------------------------

def run(model: str, settings: EngineSettings, shape: EngineShape | None = None, *,
        window: int = 1024, files_sample: int | None = None, fim_n: int = 64,
        fim_max_tokens: int = 32, heldout_list: str | Path | None = None,
        site_root: str | Path | None = None, stdlib_root: str | Path | None = None,
        seed: int = 0, parts: tuple[str, ...] = ("bpb", "fim", "headers"),
        progress: bool = True) -> dict:
    shape = shape or EngineShape()
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
                    "load_seconds": time.perf_counter() - t0}
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
        report["fim"] = fim_exact_line(engine, tok, cases, fim_max_tokens)
        _say(progress, f"FIM exact line {report['fim']['exact']}/{report['fim']['total']}")
    if "headers" in parts:
        report["headers"] = header_completions(engine, tok)
        _say(progress, f"headers parsed {report['headers']['parsed']}/{report['headers']['total']}")
    report["seconds"] = time.perf_counter() - t0
    return report
