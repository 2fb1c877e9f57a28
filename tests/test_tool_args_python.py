"""gateway/tool_args_python.py: a pythonic call's keyword arguments written as JSON as they
stream. Cut anywhere, the pieces add up to exactly what the whole-call parser makes of the same
text (json.dumps of the `ast.literal_eval`ed keyword arguments); while more may come, what is
written is a prefix of that; and the writer stops where Python would refuse the text."""
from __future__ import annotations

import ast
import json
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tool_args_python import PythonArgsWriter


def _reader(call: str) -> str | None:
    """What gateway/tool_parser_pythonic.py makes of `f(...)`'s keyword arguments, or None."""
    try:
        node = ast.parse(call, mode="eval").body
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            return None
        args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        json.dumps(args)
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None
    return json.dumps(args, ensure_ascii=False)


def _written(call: str, cuts) -> tuple[PythonArgsWriter, list[str]]:
    start = call.index("(") + 1
    w = PythonArgsWriter(start)
    pieces = [w.write(call, c) for c in sorted({start + c % (len(call) - start + 1)
                                                for c in cuts})]
    pieces.append(w.write(call, len(call), final=True))
    return w, pieces


CALLS = [
    "f()", "f( )", "f(a=1)", "f(a=1,)", "f(a='x', b=\"y\")", "f(a='''x\r\ny\rz''', b=1.5e3)",
    "f(a=r'\\d\\'', b=u'\\N{LATIN SMALL LETTER E WITH ACUTE}', c=R\"\\\n\")",
    "f(a='a' 'b' # c\n  R'\\x', b=[1, (2, 3), {'k': None}],)",
    "f(a='\\x41\\101\\u0041\\U00000041\\\nz\\0\\12x')", "f(a='''q''''x', b=\"\"\"\"\"\")",
    "f(cité='x', ｃity=2)", "f(a=-1, b=0x1F, c=1_000, d=True, e=None, f=-.5, g=1e999, h=(1))",
    "f(a={1: 'a', True: 2, None: [()], 1.5: (1,)})", "f(a='\\d\\8\\w \\%')",
    "f(a=( # c\n 'x'))", "f(a = \\\n 'x' \\\r\n 'y')", "f(a='é😀\\t\\x00\\x1f\\u2028\\\\\"')",
    "f(a='x' # (\n , b=[1, # ]\n 2])", "f(match=1, print=2, _=3)", "f(a='''it''s''')",
    # what Python (or literal_eval, or json.dumps) refuses
    "f(a=b'x')", "f(a=f'x')", "f(a=rb'x')", "f(a='x'.upper())", "f(a='x' + 'y')", "f(a=)",
    "f(a)", "f('x')", "f(**k)", "f(if=1)", "f(a=1 b=2)", "f(a='x\ny')", "f(a='a\rb')",
    "f(a={1, 2})", "f(a=set())", "f(a=1j)", "f(a=...)", "f(a=x)", "f(a=[1)", "f(a=1])",
    "f(a='\\x4')", "f(a='\\N{NO SUCH NAME}')", "f(a='\\N{LATIN', b=1)", "f(a='\\U00110000')",
    "f(a=1==1)", "f(a=--1)", "f(a='x' 'y'.strip())", "f(a=lambda: 1)", "f(a=[" * 70 + "]" * 70,
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (\\d: Python 3.11 warns)
@pytest.mark.parametrize("call", CALLS)
def test_every_cut_adds_up_to_the_readers_arguments(call):
    want = _reader(call)
    for step in (1, 2, 3, 7, len(call)):
        w, pieces = _written(call, range(0, len(call), step))
        if want is None:
            assert w.invalid and not w.done
            continue
        assert w.done and "".join(pieces) == w.text == want, (call, step)
        assert w.end == len(call)


def test_a_repeated_keyword_keeps_both_values():
    # ast reads it (only the compiler refuses it); the reader keeps the last value in the first
    # one's place, the writer cannot take the first back: the same object once parsed
    w, pieces = _written("f(a=1, b=2, a=3)", range(20))
    assert "".join(pieces) == '{"a": 1, "b": 2, "a": 3}'
    assert json.loads(w.text) == json.loads(_reader("f(a=1, b=2, a=3)"))


def test_only_what_may_still_change_waits():
    def upto(text):
        w = PythonArgsWriter(2)
        return w.write(text, len(text))
    assert upto("f(content='def f():\\n    ret") == '{"content": "def f():\\n    ret'
    assert upto("f(content='a\\") == '{"content": "a'  # (an escape's start)
    assert upto("f(content='a\\x4") == '{"content": "a'
    assert upto("f(content='a\\N{LATIN SMALL") == '{"content": "a'
    assert upto("f(content='''a''") == '{"content": "a'  # (a triple quote's end, maybe)
    assert upto("f(content='''a\r") == '{"content": "a'  # (\r\n or \r: one \n)
    assert upto("f(content='a'") == '{"content": "a'  # (the JSON string's end: 'a' 'b'?)
    assert upto("f(content='a' ") == '{"content": "a'
    assert upto("f(content='a',") == '{"content": "a"'  # (", " comes with the next key)
    assert upto("f(content='a', b=") == '{"content": "a", "b": '
    assert upto("f(n=12") == '{"n": '  # (numbers and the rest: whole at their end)
    assert upto("f(n=[1, 2]") == '{"n": '
    assert upto("f(n=[1, 2])") == '{"n": [1, 2]}'


# random keyword arguments, written as a model might, cut anywhere
SCALARS = (st.none() | st.booleans() | st.integers(-10**12, 10**12)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(st.characters(blacklist_categories=("Cs",)), max_size=10))
VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3)
                      | st.dictionaries(st.text(max_size=4), kids, max_size=3), max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), VALUES,
                       max_size=4), st.data())
def test_random_arguments_cut_anywhere(args, data):
    import keyword
    args = {k: v for k, v in args.items() if not keyword.iskeyword(k)}
    # repr writes strings with either quote and escapes; the reader decides what they are
    call = "f(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = _reader(call)
    assert want == json.dumps(args, ensure_ascii=False)
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=30))
    w, pieces = _written(call, cuts)
    assert w.done and "".join(pieces) == want
    # cut off before its end: a prefix of the whole, then invalid at the end
    n = data.draw(st.integers(2, len(call) - 1))
    w = PythonArgsWriter(2)
    assert want.startswith(w.write(call[:n], n))
    w.write(call[:n], n, final=True)
    assert w.invalid and not w.done
