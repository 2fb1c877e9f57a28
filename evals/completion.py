"""How `tidegate eval code` cuts and judges a model's completion (no torch: the rules the tests pin).

**Function headers, HumanEval-style** (what code-completion harnesses do with a header prompt):
the model's own greedy output, at most HEADER_TOKENS (256, room for a whole small function), is
cut at the first of

    <eos>                         (the caller cuts the token ids there)
    a stop string                 STOP_STRINGS: "\\ndef ", "\\nclass ", "\\nif __name__", "\\nprint("
    the end of the function       the first non-blank line after the header's own line whose
                                  indentation is <= the header's (the header's first line)

and `header + completion up to there`, dedented by the header's indentation (so a method's header
parses on its own), must be accepted by `ast.parse`. When none of the three comes within the
budget, the whole 256-token text is parsed as it is (a function the model did not finish fails
unless it happens to parse). No filtering, no retries, no repair.

**The old protocol** (`function_snippet`, 64 tokens), kept to report its figure beside the new
one: cut at the last complete line when the budget ran out and at the first non-blank line in
column 0.

**FIM lines**: the removed line against the greedy middle's first line, exactly (indentation
included, trailing spaces ignored), ignoring all whitespace, and as an edit similarity
(difflib's ratio of the two stripped lines, 0..1).
"""
from __future__ import annotations

import ast
import difflib
import textwrap

HEADER_TOKENS = 256
OLD_HEADER_TOKENS = 64
STOP_STRINGS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")


def indentation(line: str) -> int:
    """Leading spaces and tabs (a tab counts as one column, as in the held-out sources)."""
    return len(line) - len(line.lstrip(" \t"))


def header_indentation(header: str) -> int:
    first = next((ln for ln in header.split("\n") if ln.strip()), "")
    return indentation(first)


def cut_at_function_end(header: str, completion: str) -> tuple[str, str | None]:
    """(completion up to the end of the function, what ended it: "stop string", "dedent", or
    None when neither came). The completion's first line continues the header's last line and
    is never a dedent."""
    cut, why = len(completion), None
    for s in STOP_STRINGS:
        k = completion.find(s)
        if 0 <= k < cut:
            cut, why = k, "stop string"
    limit = header_indentation(header)
    start = completion.find("\n") + 1  # the first line after the header's own
    while 0 < start < cut:
        end = completion.find("\n", start)
        line = completion[start:] if end < 0 else completion[start:end]
        if line.strip() and indentation(line) <= limit:
            cut, why = start - 1, "dedent"  # drop the newline before the outer line too
            break
        start = end + 1 if end >= 0 else 0
    return completion[:cut], why


def function_source(header: str, body: str) -> str:
    """header + body, dedented by the header's indentation (a method's header parses alone)."""
    return textwrap.dedent(header + body)


def parse_error(source: str) -> str | None:
    """None when `source` parses, else the SyntaxError in one line ("msg (line N)")."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        return f"{exc.msg} (line {exc.lineno})"
    return None


def parses(source: str) -> bool:
    return parse_error(source) is None


def judge_header(header: str, completion: str, stopped_with_eos: bool) -> dict:
    """The HumanEval-style verdict on one header's completion (module docstring)."""
    body, why = cut_at_function_end(header, completion)
    finish = why or ("eos" if stopped_with_eos else "length")
    error = parse_error(function_source(header, body))
    return {"body": body, "finish": finish, "parses": error is None, "error": error}


def function_snippet(header: str, completion: str, finish_reason: str | None) -> str:
    """The old protocol: header + completion, cut at the last complete line when the token
    budget ran out ("length") and at the first non-blank line (after the header's own) in
    column 0."""
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


# ---- FIM lines --------------------------------------------------------------------------------

def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def line_exact(got: str, expected: str) -> bool:
    """Indentation included, trailing spaces ignored."""
    return got.rstrip() == expected.rstrip()


def line_exact_ignoring_whitespace(got: str, expected: str) -> bool:
    return "".join(got.split()) == "".join(expected.split())


def line_similarity(got: str, expected: str) -> float:
    """difflib's ratio of the stripped lines: 2 * matching characters / total characters."""
    return difflib.SequenceMatcher(None, got.strip(), expected.strip(), autojunk=False).ratio()
