"""`tidegate eval code`'s rules for cutting and judging a completion (evals/completion.py),
on small hand-written completions: where a function ends, what parses, the old protocol, the FIM
line comparisons, and the held-out headers chosen from source; and the FIM prompt against the
training script's documents (the shipped tokenizer, no weights)."""
from __future__ import annotations

from pathlib import Path

import pytest

from evals.completion import (
    cut_at_function_end,
    function_snippet,
    judge_header,
    line_exact,
    line_exact_ignoring_whitespace,
    line_similarity,
    parses,
)
from evals.data import FimCase, heldout_headers

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = ROOT / "models" / "tiny-coder"

BODY = '\n    """Doc.\n\n    More.\n    """\n    x = n + 1\n\n    return x\n'


def test_a_line_back_at_column_0_ends_the_function():
    body, why = cut_at_function_end("def f(n):", BODY + "\nx = f(2)\nfoo(")
    assert (body, why) == (BODY, "dedent")
    assert judge_header("def f(n):", BODY + "\nx = f(2)\nfoo(", False) == \
        {"body": BODY, "finish": "dedent", "parses": True, "error": None}


def test_stop_strings_end_the_function():
    for tail in ("def g(", "class G:", "if __name__ == '__main__':", "print(f(3)"):
        assert cut_at_function_end("def f(n):", BODY + "\n" + tail + "\n    junk((") == \
            (BODY, "stop string")
    # nested definitions and indented prints are part of the body
    nested = "\n    def g():\n        print(1)\n    return g\n"
    assert cut_at_function_end("def f(n):", nested) == (nested, None)


def test_a_method_ends_at_its_own_indentation_and_parses_dedented():
    header = "    def m(self, n):"
    body = "\n        if n:\n            return 1\n\n        return 2\n"
    got = judge_header(header, body + "\n    def other(self):\n        pass\n", False)
    assert got["finish"] == "dedent" and got["body"] == body and got["parses"]
    # a body line at the header's indentation ends it: the header alone does not parse
    got = judge_header(header, "\n    x = 1\n", False)
    assert got["body"] == "" and not got["parses"] and got["error"]


def test_an_unfinished_function_is_parsed_as_it_is():
    # the budget ran out inside the docstring: no trimming to a complete line rescues it
    text = '\n    """\n    Examples\n    ========\n\n    >>> f(2)\n    3\n    >>> f('
    got = judge_header("def f(n):", text, False)
    assert got["finish"] == "length" and not got["parses"]
    assert "unterminated triple-quoted string" in got["error"]
    # eos right after a finished body
    assert judge_header("def f(n):", "\n    return n\n", True)["finish"] == "eos"
    assert judge_header("def f(n):", "\n    return n\n", True)["parses"]
    # nothing after the header
    assert not judge_header("def f(n):", "", True)["parses"]


def test_the_blank_and_first_lines_never_end_the_function():
    # the completion's first line continues the header's line; blank lines inside the body
    # and a body on the header's own line are kept
    assert cut_at_function_end("def f(n):", " return n\n\n\nx = 1") == (" return n\n\n", "dedent")
    assert parses("def f(n):" + cut_at_function_end("def f(n):", " return n\n\n\nx = 1")[0])


def test_the_old_protocol_is_kept_for_its_figure():
    assert function_snippet("def f(n):", "\n    return n\n\ndef g(", "length") == \
        "def f(n):\n    return n\n\n"
    assert function_snippet("def f(n):", "\n    x = 1\n    retu", "length") == \
        "def f(n):\n    x = 1\n"
    assert function_snippet("def f(n): return n", "", "stop") == "def f(n): return n"
    assert not parses(function_snippet("def f(n):", "\nx = 1\n", "length"))  # no body
    assert not parses(function_snippet("def f(n):", '\n    """doc\n    more', "length"))


def test_fim_line_comparisons():
    want = "        return self.x"
    assert line_exact("        return self.x  ", want)
    assert not line_exact("    return self.x", want)  # indentation is part of the line
    assert line_exact_ignoring_whitespace("    return  self.x", want)
    assert not line_exact_ignoring_whitespace("return self.y", want)
    assert line_similarity("    return self.x", want) == 1.0
    assert line_similarity("", want) == 0.0
    assert 0.8 < line_similarity("return self.y", want) < 1.0


def test_heldout_headers_are_signature_lines_of_real_functions():
    src = (
        "import os\n\n"
        "@decorator\n"
        "def first(a,\n          b) -> int:\n    # a comment\n    x = a\n    y = b\n    return x + y\n\n"
        "def one_liner(): return 1\n\n"
        "class C:\n"
        "    def method(self):\n        a = 1\n        b = 2\n        return a + b\n"
    )
    got = heldout_headers([("pkg/m.py", src)], 5)
    assert [(h["function"], h["header"]) for h in got] == [
        ("first", "def first(a,\n          b) -> int:"),
        ("method", "    def method(self):"),
    ]


@pytest.mark.skipif(not (TOKENIZER_DIR / "tokenizer.json").is_file(),
                    reason="models/tiny-coder is not in this checkout")
def test_fim_prompt_is_the_training_documents_prefix():
    """The eval's prompt is, token for token, a training FIM document up to <fim_end>, and the
    token accuracy's truth (line, newline, <eos>) is the rest of that document."""
    pytest.importorskip("tokenizers")
    from evals.code import fim_prompt
    from tokenizer.hf_dir import load_hf_dir
    from training import train as trainer

    bundle = load_hf_dir(TOKENIZER_DIR)
    text = "def f(a, b):\n    c = a + b\n    if c:\n        return c\n    return -1\n"
    found = 0
    for seed in range(40):  # whole-line middles of one line, as the eval removes
        (doc,), _ = trainer.build_documents([("m.py", text)], 1.0, 3000, seed)
        _, _, pre, _, suf, _, mid, _ = doc
        if mid.count("\n") != 1 or not mid.endswith("\n") or (pre and not pre.endswith("\n")):
            continue
        found += 1
        trained = trainer.encode_pieces(bundle.tokenizer, [doc])[0].tolist()
        prompt = bundle.encode(fim_prompt(FimCase("m.py", "f", pre, mid[:-1], suf)))
        assert trained[:len(prompt)] == prompt
        assert trained[len(prompt):] == bundle.encode(mid, add_special_tokens=False) + \
            [bundle.eos_token_ids[0]]
    assert found >= 3
