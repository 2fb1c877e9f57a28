"""Evaluation data for `tidegate eval`: the held-out files and what is cut from them.

The held-out set is the one `training/train.py` kept out of training:
`models/tiny-coder/heldout_files.txt` lists whole held-out packages as paths
`site-packages/<path>`, looked up in THIS environment's site-packages (the `.venv` that
`make install` made, or `--site-root`); a plain relative path is looked up under this
interpreter's stdlib (`sysconfig.get_paths()["stdlib"]`, or `--stdlib-root`). Missing or
non-UTF-8 files are skipped and counted, so other package versions give a (reported) subset.

Documents and windows follow the training script's held-out protocol exactly:

    doc      = <bos> + tokens(file text) + <eos>     (text read as bytes, decoded as UTF-8)
    window i = inputs doc[i*L : i*L+L], targets doc[i*L+1 : i*L+L+1]   (the context restarts
               at every window; every token after <bos> is predicted exactly once)

A model without a bos token scores from its first token on; one without eos ends at the text.
The FIM cases and the held-out headers of `tidegate eval code` (`evals.code`) are cut
from the held-out functions here too. No torch here.
"""
from __future__ import annotations

import ast
import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_CODER_DIR = REPO_ROOT / "models" / "tiny-coder"
HELDOUT_LIST_NAME = "heldout_files.txt"
SITE_PREFIX = "site-packages/"


def default_stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def default_heldout_list(model: str) -> Path:
    """The model directory's own list when it has one, else tiny-coder's (presets use it too)."""
    own = Path(model) / HELDOUT_LIST_NAME
    return own if own.is_file() else TINY_CODER_DIR / HELDOUT_LIST_NAME


@dataclass
class HeldoutSet:
    root: Path
    listed: int                                  # paths in the list
    files: list[tuple[str, str]]                 # (relative path, text) found and readable
    missing: list[str] = field(default_factory=list)     # not under root
    unreadable: list[str] = field(default_factory=list)  # not UTF-8 / OS error

    def describe(self) -> str:
        skipped = len(self.missing) + len(self.unreadable)
        return (f"{len(self.files)} of {self.listed} held-out files under {self.root}"
                + (f" ({skipped} skipped: not found or not UTF-8)" if skipped else ""))


def default_site_root() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def load_heldout(list_path: str | Path, root: str | Path | None = None,
                 max_files: int | None = None, site_root: str | Path | None = None) -> HeldoutSet:
    """Read the listed files that exist (in list order); the first `max_files` found when given.
    A path `site-packages/REL` is REL under `site_root` (default: this environment's
    site-packages, where `make install` put the held-out packages); any other path is under
    `root` (default: this interpreter's stdlib). Raises FileNotFoundError for a missing list."""
    list_path = Path(list_path)
    if not list_path.is_file():
        raise FileNotFoundError(f"held-out list {list_path} not found")
    rels = [line.strip() for line in list_path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    root = Path(root) if root is not None else default_stdlib_root()
    site = Path(site_root) if site_root is not None else default_site_root()
    out = HeldoutSet(root=site if rels and rels[0].startswith(SITE_PREFIX) else root,
                     listed=len(rels), files=[])
    for rel in rels:
        if max_files is not None and len(out.files) >= max_files:
            break
        path = site / rel[len(SITE_PREFIX):] if rel.startswith(SITE_PREFIX) else root / rel
        if not path.is_file():
            out.missing.append(rel)
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            out.unreadable.append(rel)
            continue
        if text.strip():
            out.files.append((rel, text))
    return out


def encode_doc(tokenizer, text: str) -> list[int]:
    """`<bos> text <eos>` with a `tokenizer.bundle.TokenizerBundle` (specials added here, not
    by the tokenizer's post-processor, as the training script did)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    head = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    tail = [tokenizer.eos_token_ids[0]] if tokenizer.eos_token_ids else []
    return head + ids + tail


def encode_docs(tokenizer, texts: list[str]) -> list[list[int]]:
    """`encode_doc` of many texts through the tokenizer's parallel batch path."""
    encs = tokenizer.tokenizer.encode_batch(list(texts), add_special_tokens=False)
    head = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    tail = [tokenizer.eos_token_ids[0]] if tokenizer.eos_token_ids else []
    return [head + e.ids + tail for e in encs]


def make_windows(doc: list[int], window: int) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) per window, the training script's `make_windows` without padding."""
    out = []
    for s in range(0, len(doc) - 1, window):
        chunk = doc[s:s + window + 1]
        out.append((chunk[:-1], chunk[1:]))
    return out


def truncate_windows(windows: list[tuple[list[int], list[int]]],
                     max_tokens: int | None) -> list[tuple[list[int], list[int]]]:
    """The first `max_tokens` predicted tokens of a window list (the last window cut short)."""
    if max_tokens is None:
        return windows
    out, left = [], max_tokens
    for x, y in windows:
        if left <= 0:
            break
        out.append((x[:left], y[:left]))
        left -= len(y[:left])
    return out


def spaced_indices(total: int, n: int) -> list[int]:
    """n indices evenly spaced over range(total): floor((k + 1/2) * total / n)."""
    n = min(n, total)
    return [int((k + 0.5) * total / n) for k in range(n)]


# ---- agreement prompts ------------------------------------------------------------------------

def _fractions():
    """1/2, 1/4, 3/4, 1/8, 3/8, 5/8, 7/8, 1/16, ...: where in a file prompt rounds start."""
    d = 2
    while True:
        for k in range(1, d, 2):
            yield k / d
        d *= 2


def agreement_prompts(docs: list[list[int]], num_prompts: int, prompt_len: int,
                      bos_token_id: int | None) -> list[list[int]]:
    """`num_prompts` prompts of `prompt_len` held-out tokens (plus a leading bos when the model
    has one, as the service's tokenizer adds it). Prompt i comes from document i mod F (F = the
    documents long enough), round r = i div F starts at fraction 1/2, 1/4, 3/4, 1/8, ... of it."""
    usable = [d for d in docs if len(d) > prompt_len + 2]
    if not usable:
        raise ValueError(f"no held-out document is longer than {prompt_len} tokens")
    fracs = _fractions()
    round_frac: list[float] = []
    prompts = []
    for i in range(num_prompts):
        doc = usable[i % len(usable)]
        r = i // len(usable)
        while len(round_frac) <= r:
            round_frac.append(next(fracs))
        start = min(int(len(doc) * round_frac[r]), len(doc) - prompt_len)
        body = doc[start:start + prompt_len]
        if bos_token_id is not None and body[0] != bos_token_id:
            body = [bos_token_id] + body
        prompts.append(body)
    return prompts


# ---- held-out functions ---------------------------------------------------------------------

def heldout_functions(files: list[tuple[str, str]], min_lines: int = 4, max_lines: int = 40):
    """(path, function node, the file's lines) of every (async) function of 4-40 lines (decorators
    counted) in `files`, in file order, then ast.walk order."""
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
            if min_lines <= node.end_lineno - first + 1 <= max_lines:
                yield path, node, lines


@dataclass(frozen=True)
class FimCase:
    path: str
    function: str
    prefix: str
    middle: str   # the removed line, without its newline
    suffix: str


def fim_cases(files: list[tuple[str, str]], n: int, seed: int = 0,
              min_lines: int = 4, max_lines: int = 40) -> list[FimCase]:
    """`n` FIM cases (`evals.code`'s docstring): in each of `n` functions evenly spaced
    over those with a usable line, one single-line statement of the body (not the docstring),
    chosen by a RNG seeded with the seed, path, name and line, is the middle."""
    funcs = []
    for path, node, lines in heldout_functions(files, min_lines, max_lines):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
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


def heldout_headers(files: list[tuple[str, str]], n: int) -> list[dict]:
    """The signature lines (decorators left out) of `n` held-out functions evenly spaced over
    every function of 4-40 lines with a body on lines of its own."""
    found = []
    for path, node, lines in heldout_functions(files):
        if node.body[0].lineno <= node.lineno:
            continue  # `def f(): return x` has no header of its own
        sig = lines[node.lineno - 1:node.body[0].lineno - 1]
        while sig and (not sig[-1].strip() or sig[-1].lstrip().startswith("#")):
            sig.pop()  # a comment or blank line before the body belongs to the body
        if sig and sig[-1].rstrip().endswith(":"):
            found.append({"path": path, "function": node.name, "header": "".join(sig).rstrip()})
    return [found[i] for i in spaced_indices(len(found), n)] if found else []
