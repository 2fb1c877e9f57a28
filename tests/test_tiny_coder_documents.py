"""tiny-coder's training documents (issue 36): `<eos>` where a function or class ends, function
documents (plain and FIM) beside the file's own, and doctest-heavy files thinned in the corpus."""
from __future__ import annotations

import ast

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("torch")

from training import corpus as C
from training import train as T

IDS = {s: i for i, s in enumerate(T.SPECIAL_TOKENS)}


def _module(n_funcs: int = 12, body: int = 4) -> str:
    out = ['"""A module."""\n', "import os\n", "\n"]
    for i in range(n_funcs):
        if i % 3 == 0:
            out.append("# a comment above the function\n")
        if i % 4 == 0:
            out.append("@decorator\n")
        out.append(f"def f{i}(a, b=None):\n")
        out.append(f'    """Doc of f{i}."""\n')
        out += [f"    a = a + {k}\n" for k in range(body)]
        out.append("    return a\n\n\n")
    out.append("class K:\n    x = 1\n\n    def m(self):\n        y = 2\n        z = 3\n"
               "        return y + z\n\n\n")
    out.append('if __name__ == "__main__":\n    print(f0(1))\n')
    return "".join(out)


def _plain_and_fim(docs):
    rebuilt = []
    for d in docs:
        assert d[0] == IDS[T.BOS] and d[-1] == IDS[T.EOS]
        if d[1] == IDS[T.FIM_BEGIN]:
            _, _, pre, hole, suf, end, mid, _ = d
            assert (hole, end) == (IDS[T.FIM_HOLE], IDS[T.FIM_END])
            rebuilt.append(pre + mid + suf)
        else:
            rebuilt.append(d[1])
    return rebuilt


def test_segments_end_where_top_level_units_end():
    text = _module()
    segs = T.split_segments(text, 400)
    assert "".join(segs) == text and len(segs) > 3
    for seg in segs[1:]:  # every segment starts a unit: a column-0 line, never a body line
        assert seg[0] not in " \t\n", seg[:40]
        assert seg.startswith(("def ", "@", "# a comment", "class ", "if __name__"))
    # a unit longer than the limit is cut at lines; a file that does not parse, at lines
    long = "def g():\n" + "".join(f"    x{k} = {k}\n" for k in range(200))
    assert all(len(s) <= 300 for s in T.split_segments(long, 300))
    broken = "def g(:\n" + "    x = 1\n" * 100
    assert T.split_segments(broken, 300) == T.split_lines(broken, 300)


def test_plain_eos_comes_at_a_unit_end_or_the_file_end():
    files = [(f"m{i}.py", _module()) for i in range(20)]
    docs, st = T.build_documents(files, 0.5, 400, seed=1)
    assert st["plain_eos_inside"] == 0
    assert st["plain_eos_at_unit_end"] > 0 and st["plain_eos_at_file_end"] > 0
    for d in docs:
        if d[1] != IDS[T.FIM_BEGIN]:  # plain: ends with a whole line, at the end of a unit
            assert d[1].endswith("\n")
    # the old rule cut at any line: its <eos> fell inside functions
    old = [(p, "".join(T.split_lines(t, 400))) for p, t in files]
    _, st_lines = T.build_documents(old, 0.5, 97, seed=1)
    assert st_lines["plain_eos_inside"] > 0


def test_each_file_is_there_once_and_functions_beside_it():
    text = _module()
    docs, st = T.build_documents([("m.py", text)], 0.5, 400, seed=3, function_rate=1.0,
                                 function_fim_rate=0.0)
    n_file = st["fim_documents"] + st["plain_documents"]
    assert "".join(_plain_and_fim(docs[:n_file])) == text  # every character once, in order
    funcs = docs[n_file:]
    tree = ast.parse(text)
    want = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert st["function_documents"] == len(funcs) == len(want)  # all 3-60-line functions
    lines = text.splitlines(keepends=True)
    for d, node in zip(funcs, want):
        first = min([node.lineno, *(x.lineno for x in node.decorator_list)])
        assert d == [IDS[T.BOS], "".join(lines[first - 1:node.end_lineno]), IDS[T.EOS]]
    # a method keeps its indentation (the evaluation prompts methods as they are written)
    assert any(d[1].startswith("    def m(self):") for d in funcs)
    assert any(d[1].startswith("@decorator\ndef f0") for d in funcs)
    # off by default: the v2 rule
    _, st0 = T.build_documents([("m.py", text)], 0.5, 400, seed=3)
    assert st0["function_documents"] == st0["function_fim_documents"] == 0


def test_function_fim_documents_cut_one_function():
    text = _module()
    docs, st = T.build_documents([("m.py", text)], 0.0, 400, seed=5, function_rate=1.0,
                                 function_fim_rate=1.0)
    fims = [d for d in docs if d[1] == IDS[T.FIM_BEGIN]]
    assert len(fims) == st["function_fim_documents"] > 0
    sources = {d for d in _plain_and_fim(fims)}
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    whole = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([n.lineno, *(x.lineno for x in n.decorator_list)])
            whole.add("".join(lines[first - 1:n.end_lineno]))
    assert sources <= whole  # prefix + middle + suffix is one whole function
    single = 0
    for d in fims:
        _, _, pre, _, _, _, mid, _ = d
        assert mid.endswith("\n") and (not pre or pre.endswith("\n"))  # whole lines
        single += mid.count("\n") == 1
    assert single >= len(fims) // 2  # mostly one statement, as the evaluation removes


def test_function_fim_holes_give_each_function_several_holes():
    """--function-fim-holes K: a function chosen for FIM gives K documents of that function, each
    with its own hole (most holes differ); K=1 is the old rule, document for document."""
    text = _module(12, body=6)
    one, st1 = T.build_documents([("m.py", text)], 0.0, 400, seed=5, function_rate=1.0,
                                 function_fim_rate=1.0)
    assert T.build_documents([("m.py", text)], 0.0, 400, seed=5, function_rate=1.0,
                             function_fim_rate=1.0, function_fim_holes=1) == (one, st1)
    three, st3 = T.build_documents([("m.py", text)], 0.0, 400, seed=5, function_rate=1.0,
                                   function_fim_rate=1.0, function_fim_holes=3)
    assert st3["function_fim_documents"] == 3 * st1["function_fim_documents"] > 0
    fims = [d for d in three if d[1] == IDS[T.FIM_BEGIN]]
    whole = _plain_and_fim(fims)
    holes = {}
    for d, src in zip(fims, whole):
        holes.setdefault(src, set()).add(len(d[2]))  # the prefix's length locates the hole
    assert all(len(v) >= 2 for v in holes.values())  # each function: more than one hole


def test_documents_are_the_same_from_any_number_of_workers_and_seeded(monkeypatch):
    import multiprocessing

    methods = []  # the workers come from a forkserver: a fork of a threaded process can deadlock
    real = multiprocessing.get_context
    monkeypatch.setattr(multiprocessing, "get_context", lambda m=None: methods.append(m) or real(m))
    files = [(f"m{i}.py", _module(4 + i % 5)) for i in range(24)]
    a = T.build_documents(files, 0.5, 300, 7, 0.5, 0.5, workers=1)
    b = T.build_documents(files, 0.5, 300, 7, 0.5, 0.5, workers=3)
    assert a == b
    assert methods == ["forkserver"]
    c = T.build_documents(files, 0.5, 300, 8, 0.5, 0.5)
    assert c[0] != a[0]


# ---- doctest-heavy files in the corpus ---------------------------------------------------------

def _doctest_file(n_examples: int, code_lines: int) -> str:
    ex = "".join(f"    >>> f({k})\n    {k * k}\n" for k in range(n_examples))
    return ('def f(x):\n    """Square.\n\n    Examples\n    ========\n\n' + ex + '    """\n'
            + "".join(f"    y{k} = x * {k}\n" for k in range(code_lines)) + "    return x * x\n")


def test_doctest_block_bytes():
    text = _doctest_file(3, 2)
    block = "".join(f"    >>> f({k})\n    {k * k}\n" for k in range(3))  # not the quotes
    assert C.doctest_block_bytes(text) == len(block.encode())
    assert C.doctest_block_bytes("x = 1\n") == 0


def test_doctest_heavy_training_files_are_thinned_to_the_share():
    items = []
    for i in range(400):
        heavy = i % 2 == 0
        text = _doctest_file(20, 2) if heavy else _doctest_file(1, 60)
        items.append({"split": "train", "source": "s", "path": f"p/{i}.py", "text": text,
                      "dup": None})
    items.append({"split": "val", "source": "v", "path": "v/0.py", "text": _doctest_file(20, 2),
                  "dup": None})
    heavy_share = C.doctest_block_bytes(items[0]["text"]) / len(items[0]["text"].encode())
    light_share = C.doctest_block_bytes(items[1]["text"]) / len(items[1]["text"].encode())
    assert heavy_share > 0.5 and light_share < 0.05
    n = C.thin_doctests(items, 0.05)
    kept_heavy = sum(it["dup"] is None for it in items[:400:2])
    assert n == 200 - kept_heavy
    assert all(it["dup"] is None for it in items[1:400:2])  # light files stay
    assert items[-1]["dup"] is None  # validation is never thinned
    # about max_share / share of them stay
    assert abs(kept_heavy / 200 - 0.05 / heavy_share) < 0.06
    for it in items:
        it["dup"] = None
    assert C.thin_doctests(items, 1.0) == 0  # the rule off


def test_a_class_over_the_limit_is_cut_before_its_methods():
    methods = "".join(f"    # method {k}\n    def m{k}(self, x):\n"
                      + "".join(f"        x = x + {j}\n" for j in range(6)) + "        return x\n\n"
                      for k in range(30))
    text = "import os\n\n\nclass Big:\n    \"\"\"Doc.\"\"\"\n\n" + methods
    segs = T.split_segments(text, 600)
    assert "".join(segs) == text and len(segs) > 5
    assert all(T.starts_definition(s) for s in segs[1:])
    assert all(s.startswith(("    # method", "class Big")) for s in segs[1:])
    assert not T.starts_definition("        x = 1\n") and T.starts_definition("    @property\n")


def test_function_documents_without_their_docstring():
    """--function-nodoc-rate: a plain function document may drop the docstring (on lines of its
    own, with body after it); what is left parses and is the function minus those lines; the
    rate 0 keeps every document as before (same random choices)."""
    import textwrap

    text = _module() + ('def g(x):\n    """Two\n    lines."""\n    return x\n\n\n'
                        'def h(x):\n    """shares a line"""; y = x\n    return y\n\n\n'
                        'def only():\n    """Doc\n    only."""\n')
    kw = {"fim_rate": 0.0, "seg_chars": 400, "seed": 5, "function_rate": 1.0,
          "function_fim_rate": 0.0}
    base, st0 = T.build_documents([("m.py", text)], **kw)
    docs, st = T.build_documents([("m.py", text)], **kw, function_nodoc_rate=1.0)
    assert st0["function_documents_without_docstring"] == 0
    assert sum('"""' in d[1] for d in base if len(d) == 3) >= 15  # all kept at rate 0
    assert st["function_documents"] == st0["function_documents"]
    assert st["function_documents_without_docstring"] == 13  # f0..f11 and g; not h, not only
    plain = [d[1] for d in docs if len(d) == 3 and d[1].lstrip().startswith(("def", "@", "#"))]
    stripped = [b for b in plain if '"""' not in b]
    for body in stripped:
        ast.parse(textwrap.dedent(body))
    assert any(b.startswith("def g(x):\n    return x") for b in stripped)
    assert any(b.startswith('def h(x):\n    """shares a line"""; y') for b in plain)
    assert any(b.startswith('def only():\n    """Doc\n') for b in plain)
    # half the rate: about half of them
    _, half = T.build_documents([(f"m{i}.py", text) for i in range(8)], **kw,
                                function_nodoc_rate=0.5)
    assert 0.25 < half["function_documents_without_docstring"] / (8 * 13) < 0.75
