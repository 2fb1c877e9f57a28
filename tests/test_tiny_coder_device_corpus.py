"""training.device_corpus (issue 36, v4): the corpus built on the training machine from its own
Python, with the held-out and validation text carried. What must hold: a held-out or validation
distribution of the machine is never read, whatever its version; a copy of one inside another
distribution is dropped by its import name; a copy of a carried held-out file under any other
name is dropped by its text; a carried training source the machine also has is replaced by the
machine's version; the manifest records all of it."""
from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training import device_corpus as D


def _code(name: str, n: int = 6) -> str:
    return "".join(f"def {name}_{i}(x, y):\n    \"\"\"{name} {i}.\"\"\"\n    z = x * {i} + y\n"
                   f"    return z - {i * 7}\n\n\n" for i in range(n))


HELDOUT_TEXT = _code("click_core", 8)


def _dist(site: Path, name: str, version: str, licence: str, files: dict[str, str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f"License-Expression: {licence}\n\n")
    rows = []
    for rel, text in files.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        rows.append(f"{rel},,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")


@pytest.fixture
def machine(tmp_path):
    site, stdlib = tmp_path / "site", tmp_path / "stdlib"
    stdlib.mkdir()
    (stdlib / "shutil.py").write_text(_code("stdlib_shutil"))
    _dist(site, "goodpkg", "2.0", "MIT", {"goodpkg/__init__.py": _code("good_new")})
    # the held-out package, another version: never read
    _dist(site, "click", "9.9", "BSD-3-Clause", {"click/core.py": _code("click_other", 5),
                                                   "click/extra.py": _code("click_extra")})
    # the validation package's relative (httpx2 was derived from httpx)
    _dist(site, "httpx", "0.28", "BSD-3-Clause", {"httpx/_api.py": _code("httpx_api")})
    # a copy of a held-out package inside another distribution: dropped by its import name
    _dist(site, "bundler", "1.0", "MIT", {"bundler/__init__.py": _code("bundler"),
                                          "bundler/extern/jinja2/lexer.py": _code("jinja_copy")})
    # a held-out file's text under another name: dropped by the de-duplication
    _dist(site, "copycat", "1.0", "MIT", {"copycat/core.py": HELDOUT_TEXT})
    _dist(site, "gplpkg", "1.0", "GPL-3.0-only", {"gplpkg/a.py": _code("gpl")})
    carry = tmp_path / "carry"
    carry.mkdir()
    recs = [
        {"split": "heldout", "source": "click", "path": "site-packages/click/core.py",
         "text": HELDOUT_TEXT},
        {"split": "heldout", "source": "Jinja2", "path": "site-packages/jinja2/lexer.py",
         "text": _code("jinja_lexer")},
        {"split": "val", "source": "anyio", "path": "site-packages/anyio/_core.py",
         "text": _code("anyio_core")},
        {"split": "train", "source": "openai", "path": "site-packages/openai/api.py",
         "text": _code("openai_api")},
        {"split": "train", "source": "goodpkg", "path": "site-packages/goodpkg/__init__.py",
         "text": _code("good_old")},
    ]
    with lzma.open(carry / D.CARRY_FILE, "wt", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    (carry / "carry_manifest.json").write_text(json.dumps({"sources": [
        {"name": "click", "version": "8.5.1", "licence": "BSD-3-Clause", "spdx": ["BSD-3-Clause"],
         "split": "heldout", "files": 1, "bytes": 1},
        {"name": "Jinja2", "version": "3.1.6", "licence": "BSD", "spdx": ["BSD"],
         "split": "heldout", "files": 1, "bytes": 1},
        {"name": "anyio", "version": "4.16.0", "licence": "MIT", "spdx": ["MIT"],
         "split": "val", "files": 1, "bytes": 1},
        {"name": "openai", "version": "3.60.0", "licence": "Apache-2.0", "spdx": ["Apache-2.0"],
         "split": "train", "files": 1, "bytes": 1},
        {"name": "goodpkg", "version": "1.0", "licence": "MIT", "spdx": ["MIT"],
         "split": "train", "files": 1, "bytes": 1}]}))
    return site, stdlib, carry


def _build(machine, out: Path, *extra: str) -> tuple[int, list[dict], dict]:
    site, stdlib, carry = machine
    rc = D.main(["build", "--carry", str(carry), "--out", str(out), "--workers", "2",
                 "--site-packages", str(site), "--stdlib", str(stdlib), *extra])
    recs = [json.loads(x) for x in (out / "corpus.jsonl").read_text().splitlines()] \
        if (out / "corpus.jsonl").is_file() else []
    man = json.loads((out / "manifest.json").read_text()) if rc == 0 else {}
    return rc, recs, man


def test_the_machine_corpus_keeps_held_out_and_validation_text_out_of_training(machine, tmp_path):
    rc, recs, man = _build(machine, tmp_path / "out")
    assert rc == 0
    train = {r["path"] for r in recs if r["split"] == "train"}
    assert train == {"stdlib/shutil.py", "site-packages/goodpkg/__init__.py",
                     "site-packages/bundler/__init__.py", "site-packages/openai/api.py"}, train
    # the machine's goodpkg replaced the carried one; the carried held-out text is the held-out
    good = next(r for r in recs if r["path"] == "site-packages/goodpkg/__init__.py")
    assert "good_new" in good["text"]
    held = [r for r in recs if r["split"] == "heldout"]
    assert {r["path"] for r in held} == {"site-packages/click/core.py",
                                         "site-packages/jinja2/lexer.py"}
    assert next(r for r in held if "click" in r["path"])["text"] == HELDOUT_TEXT
    assert [r["path"] for r in recs if r["split"] == "val"] == ["site-packages/anyio/_core.py"]
    c = man["device_build"]["contamination"]
    assert c["check"] == "passed"
    assert sorted(c["excluded_distributions"]) == ["click 9.9", "httpx 0.28"]
    assert c["files_dropped_by_module_name"] == 1  # bundler/extern/jinja2/lexer.py
    assert c["train_files_dropped_as_duplicates_of_heldout_or_val"] == 1  # copycat/core.py
    roles = {s["name"]: (s["role"], s["origin"]) for s in man["sources"]}
    assert roles["gplpkg"][0] == "excluded (licence)"
    assert roles["goodpkg"] == ("train", "device")
    assert roles["goodpkg (carried, replaced)"][0] == "replaced by the machine's version"
    assert roles["openai"] == ("train", "carried")
    assert roles["click"] == ("heldout", "carried")
    assert roles["click (the machine's copy)"][1] == "device"
    assert {"click", "jinja2", "anyio", "httpx"} <= set(man["device_build"]["excluded_import_names"])
    assert man["device_build"]["timing_s"]["total_s"] > 0


def test_the_readers_come_from_a_forkserver_not_a_fork(machine, tmp_path, monkeypatch):
    """A fork of the test process (or of any process that runs threads) can copy a lock another
    thread holds into the child, which then waits on it for ever: the project's CI hung 90 minutes
    in this file. The readers must be started from a clean process."""
    import multiprocessing

    methods = []
    real = multiprocessing.get_context

    def spy(method=None):
        methods.append(method)
        return real(method)

    monkeypatch.setattr(multiprocessing, "get_context", spy)
    rc, recs, _ = _build(machine, tmp_path / "out")
    assert rc == 0 and recs and methods and "fork" not in methods and None not in methods, methods


def test_a_zero_time_budget_reads_the_carry_and_leaves_the_machine_files_out(machine, tmp_path):
    rc, recs, man = _build(machine, tmp_path / "out", "--time-budget-s", "0")
    assert rc == 0
    assert {r["split"] for r in recs} >= {"heldout", "val"}
    assert man["device_build"]["files_left_unread"] >= 1


def test_path_hits_is_the_module_or_a_directory_on_the_path():
    names = {"click", "jinja2", "_hypothesis_globals"}
    assert D.path_hits("site-packages/click/core.py", names)
    assert D.path_hits("site-packages/_hypothesis_globals.py", names)
    assert D.path_hits("site-packages/foo/extern/jinja2/lexer.py", names)
    assert not D.path_hits("site-packages/foo/click.py", names)  # a module named like it
    assert not D.path_hits("site-packages/clicker/core.py", names)
    assert D.top_names(["site-packages/click/core.py", "site-packages/_hypothesis_globals.py",
                        "stdlib/os.py"]) == {"click", "_hypothesis_globals"}


def test_the_carry_leaves_out_what_the_machine_has(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    recs = [{"split": "heldout", "source": "click", "path": "site-packages/click/a.py", "text": "a"},
            {"split": "val", "source": "anyio", "path": "site-packages/anyio/b.py", "text": "b"},
            {"split": "train", "source": "python-stdlib", "path": "stdlib/os.py", "text": "c"},
            {"split": "train", "source": "torch", "path": "site-packages/torch/d.py", "text": "d"},
            {"split": "train", "source": "openai", "path": "site-packages/openai/e.py", "text": "e"}]
    (src / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (src / "manifest.json").write_text(json.dumps({
        "heldout_packages": ["click"], "validation_packages": ["anyio"], "python": "3.11.7",
        "sources": [{"name": r["source"], "version": "1", "licence": "MIT", "spdx": ["MIT"],
                     "role": r["split"]} for r in recs]}))
    pkgs = tmp_path / "pkgs.txt"
    pkgs.write_text("# the image\ntorch\nclick\nanyio\n")
    kept = D.make_carry(src, pkgs, tmp_path / "carry")
    assert sorted(kept) == ["anyio", "click", "openai"]
    with lzma.open(tmp_path / "carry" / D.CARRY_FILE, "rt") as f:
        assert [json.loads(x)["path"] for x in f] == [
            "site-packages/click/a.py", "site-packages/anyio/b.py", "site-packages/openai/e.py"]


# ---- v5: the scientific group's cap and the carried standard-library tests ------------------

def test_is_stdlib_test_is_a_test_directory_of_the_standard_library():
    assert D.is_stdlib_test("stdlib/test/test_os.py")
    assert D.is_stdlib_test("stdlib/test/test_asyncio/test_tasks.py")
    assert D.is_stdlib_test("stdlib/idlelib/idle_test/test_run.py")
    assert D.is_stdlib_test("stdlib/tkinter/test/test_misc.py")
    assert not D.is_stdlib_test("stdlib/os.py")
    assert not D.is_stdlib_test("stdlib/unittest/case.py")
    assert not D.is_stdlib_test("stdlib/test.py")
    assert not D.is_stdlib_test("site-packages/foo/tests/test_a.py")


def test_the_carry_can_take_the_stdlib_tests_as_a_source_of_their_own(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    recs = [{"split": "train", "source": "python-stdlib", "path": "stdlib/os.py", "text": "a"},
            {"split": "train", "source": "python-stdlib", "path": "stdlib/test/test_os.py",
             "text": "b"},
            {"split": "val", "source": "anyio", "path": "site-packages/anyio/b.py", "text": "c"}]
    (src / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (src / "manifest.json").write_text(json.dumps({
        "heldout_packages": ["click"], "validation_packages": ["anyio"], "python": "3.11.7",
        "sources": [{"name": "python-stdlib", "version": "3.11.7", "licence": "PSF-2.0",
                     "spdx": ["PSF-2.0"], "role": "train"},
                    {"name": "anyio", "version": "4", "licence": "MIT", "spdx": ["MIT"],
                     "role": "val"}]}))
    pkgs = tmp_path / "pkgs.txt"
    pkgs.write_text("anyio\n")
    # v4's carry: no stdlib file travels
    assert sorted(D.make_carry(src, pkgs, tmp_path / "c4")) == ["anyio"]
    kept = D.make_carry(src, pkgs, tmp_path / "c5", stdlib_tests=True)
    assert sorted(kept) == ["anyio", D.STDLIB_TESTS]
    with lzma.open(tmp_path / "c5" / D.CARRY_FILE, "rt") as f:
        got = [json.loads(x) for x in f]
    assert [(r["source"], r["path"]) for r in got] == [
        (D.STDLIB_TESTS, "stdlib/test/test_os.py"), ("anyio", "site-packages/anyio/b.py")]
    man = json.loads((tmp_path / "c5" / "carry_manifest.json").read_text())
    st = next(s for s in man["sources"] if s["name"] == D.STDLIB_TESTS)
    assert (st["split"], st["licence"], st["version"], st["files"]) == ("train", "PSF-2.0",
                                                                        "3.11.7", 1)


def _add_to_carry(carry: Path, recs: list[dict], sources: list[dict]) -> None:
    with lzma.open(carry / D.CARRY_FILE, "rt", encoding="utf-8") as f:
        old = f.read()
    with lzma.open(carry / D.CARRY_FILE, "wt", encoding="utf-8") as f:
        f.write(old + "".join(json.dumps(r) + "\n" for r in recs))
    man = json.loads((carry / "carry_manifest.json").read_text())
    man["sources"] += sources
    (carry / "carry_manifest.json").write_text(json.dumps(man))


def test_the_build_keeps_the_carried_stdlib_tests_beside_the_machines_stdlib(machine, tmp_path):
    _add_to_carry(machine[2], [{"split": "train", "source": D.STDLIB_TESTS,
                                "path": "stdlib/test/test_shutil.py",
                                "text": _code("stdlib_test_shutil")}],
                  [{"name": D.STDLIB_TESTS, "version": "3.11.7", "licence": "PSF-2.0",
                    "spdx": ["PSF-2.0"], "split": "train", "files": 1, "bytes": 1}])
    rc, recs, man = _build(machine, tmp_path / "out")
    assert rc == 0
    train = {r["path"]: r["source"] for r in recs if r["split"] == "train"}
    assert train["stdlib/test/test_shutil.py"] == D.STDLIB_TESTS
    assert train["stdlib/shutil.py"] == "python-stdlib"
    roles = {s["name"]: (s["role"], s["origin"]) for s in man["sources"]}
    assert roles[D.STDLIB_TESTS] == ("train", "carried")
    assert man["device_build"]["contamination"]["check"] == "passed"


def test_the_group_cap_lowers_only_the_groups_sources(machine, tmp_path):
    site = machine[0]
    big = {f"bigsci/m{i}.py": _code(f"bigsci_{i}", 20) for i in range(6)}
    _dist(site, "bigsci", "1.0", "MIT", big)
    _dist(site, "bigweb", "1.0", "MIT", {f"bigweb/m{i}.py": _code(f"bigweb_{i}", 20)
                                         for i in range(6)})
    per_file = len(_code("bigsci_0", 20).encode())
    rc, recs, man = _build(machine, tmp_path / "v4")
    assert rc == 0
    n4 = {s: sum(r["source"] == s for r in recs) for s in ("bigsci", "bigweb")}
    assert n4 == {"bigsci": 6, "bigweb": 6}
    assert man["device_build"]["group_max_bytes"] == 0 and man["device_build"]["group"] == []
    rc, recs, man = _build(machine, tmp_path / "v5", "--group-max-bytes", str(2.5 * per_file),
                           "--group", "bigsci", "torch")
    assert rc == 0
    n5 = {s: sum(r["source"] == s for r in recs) for s in ("bigsci", "bigweb")}
    assert n5 == {"bigsci": 2, "bigweb": 6}, n5
    assert man["device_build"]["group_max_bytes"] == 2.5 * per_file
    assert man["device_build"]["group"] == ["bigsci", "torch"]


def test_the_scientific_group_names_the_largest_of_v4s_scientific_sources():
    group = {D.norm_key(x) for x in D.SCIENTIFIC}
    for name in ("transformers", "statsmodels", "pandas", "scikit-learn", "scipy", "numba",
                 "jax", "sympy", "matplotlib", "numpy", "torch", "xarray", "networkx"):
        assert D.norm_key(name) in group, name
    # general-purpose, CLI, web and testing code stays uncapped
    for name in ("python-stdlib", "pygments", "pytest", "rich", "typer", "werkzeug", "requests",
                 "urllib3", "openai", "anthropic", "setuptools", "pip", "coverage"):
        assert D.norm_key(name) not in group, name
