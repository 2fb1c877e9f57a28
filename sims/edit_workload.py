"""Edit workloads (issue 28): a prediction that equals the expected output except for a chosen
fraction of its lines. Written once for the live benchmark (`bench.serving.edit`, on text) and
the simulator (`sims.speculation`, on token ids), so both alter the same way: the same share of
lines, picked by the same seeded draw.

`keep` is the fraction of lines left unchanged (1.0: the prediction is the output; 0.75: a
quarter of the lines differ). A line is altered so that its tokens differ from the original's
(text: every identifier renamed, the indentation kept; tokens: every token replaced by another
id), so a drafter that reaches it is rejected there and has to re-synchronise after it.
"""
from __future__ import annotations

import re

import numpy as np

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


def lines_to_alter(num_lines: int, keep: float, rng: np.random.Generator,
                   eligible: list[int] | None = None) -> list[int]:
    """Which line indexes to alter: round((1 - keep) * lines) of the eligible ones (all by
    default), drawn without replacement."""
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must be in [0, 1], got {keep}")
    pool = list(range(num_lines)) if eligible is None else list(eligible)
    n = min(len(pool), round((1.0 - keep) * len(pool)))
    if n <= 0:
        return []
    return sorted(int(i) for i in rng.choice(pool, size=n, replace=False))


def alter_line(line: str) -> str:
    """One line of code changed throughout: identifiers and numbers renamed, indentation kept
    (a blank line gets a comment)."""
    body = line.lstrip()
    indent = line[:len(line) - len(body)]
    if not body.strip():
        return line + "# changed"
    changed = _WORD.sub(lambda m: f"{m.group(0)}_v2" if not m.group(0).isdigit()
                        else str(int(m.group(0)) + 1), body)
    if changed == body:  # punctuation only
        changed = body + "  # changed"
    return indent + changed


def alter_text(text: str, keep: float, seed: int | np.random.Generator = 0) -> tuple[str, int]:
    """`text` with round((1 - keep) * non-blank lines) of its non-blank lines altered ->
    (altered text, number of lines altered)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    lines = text.split("\n")
    eligible = [i for i, line in enumerate(lines) if line.strip()]
    picked = lines_to_alter(len(lines), keep, rng, eligible)
    for i in picked:
        lines[i] = alter_line(lines[i])
    return "\n".join(lines), len(picked)


def token_lines(tokens: list[int], newline: int) -> list[tuple[int, int]]:
    """[start, end) of each line of a token list (a line ends after its `newline` token)."""
    spans, start = [], 0
    for i, t in enumerate(tokens):
        if t == newline:
            spans.append((start, i + 1))
            start = i + 1
    if start < len(tokens):
        spans.append((start, len(tokens)))
    return spans


def alter_tokens(tokens: list[int], keep: float, newline: int, fresh_id: int,
                 seed: int | np.random.Generator = 0) -> tuple[list[int], int]:
    """The token-level `alter_text`: round((1 - keep) * lines) lines get every token but their
    newline replaced by ids from `fresh_id` up (ids the output never holds) -> (altered
    tokens, lines altered)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    spans = token_lines(tokens, newline)
    picked = lines_to_alter(len(spans), keep, rng)
    out = list(tokens)
    next_id = fresh_id
    for i in picked:
        a, b = spans[i]
        for j in range(a, b):
            if out[j] != newline:
                out[j] = next_id
                next_id += 1
    return out, len(picked)
