r"""tiny-coder's training corpus built ON the training machine from its own Python (issue 36, v4).

The device call's tree is ~51 MB of a 64 MiB (67.1 MB) transfer, so the corpus cannot travel
whole any more (v3's, capped at 6 MB per source, was 19.5 MB of xz). The H200 image has its own
Python 3.12 standard library and ~200 distributions (torch, transformers, jax, pandas,
scikit-learn, statsmodels, sympy, scipy, ...; /work/.library/device/KINDS.md). So:

  carry (here, small)    the held-out and validation files (the evaluation's and the checkpoint
                         choice's text, exactly as the development machine has them) and the
                         training files of the distributions the image does not have (openai,
                         anthropic, ray, kubernetes, pydantic, fastapi, ...), from a built corpus:

      python -m training.device_corpus carry --from .carry-tc-6mb/corpus \
          --device-packages training/device_packages.txt --out .carry-tc-v4

  build (there)          every `.py` of that machine's standard library and installed
                         distributions under `training.corpus`'s rules (RECORD files, vendored
                         directories out, UTF-8, size and long-line limits, permissive licences
                         only, exact + MinHash near de-duplication with priority held-out >
                         validation > training, per-source cap, doctest thinning), plus the
                         carried files; read and hashed in `--workers` processes, bounded by
                         `--time-budget-s` (files past it are left out and counted):

      python -m training.device_corpus build --carry .carry-tc-v4 --out /tmp/tc-v4/corpus \
          --workers 16 --time-budget-s 90

Contamination is impossible by construction, four ways, each logged and counted in the manifest
(`contamination`):
  1. By distribution: a distribution of the machine whose name is a held-out or validation
     package (`corpus.HELDOUT`, `corpus.VALIDATION`: aiohttp, hypothesis, jinja2, click; fsspec,
     anyio, pyparsing, httpx2, h11) or a relative of one (`RELATIVES`: httpx, the project httpx2
     was derived from) is never read -- whatever its version (the image has aiohttp, hypothesis,
     jinja2, click, fsspec, anyio, pyparsing, h11 and httpx: other versions than the held-out
     files', so removing "our" files by path would leave theirs in).
  2. By module name: a training file whose top-level module, or any directory on its path, is one
     of the held-out / validation packages' import names (read from the carried files' paths:
     aiohttp, hypothesis, _hypothesis_*, jinja2, click, ...) is dropped, wherever it is installed
     (a copy inside another distribution, one installed without metadata).
  3. By text: the carried held-out and validation files go first into the de-duplication, so any
     training file equal to one of them (after trailing spaces) or a near duplicate (estimated
     Jaccard >= 0.8 over word 5-grams) is dropped.
  4. A final check fails the build (exit 3) if any training record's source or path matches 1 or
     2, or its text's digest equals a held-out or validation file's.
The held-out and validation text is the carried one (the development machine's versions, the
files `models/tiny-coder/heldout_files.txt` lists), never the machine's.

Output: `--out DIR/corpus.jsonl` and `manifest.json`, as `training.corpus` writes them (sources
with versions, licences, roles and origin "device" or "carried"), plus the machine's Python, its
site directories, the build's timing and the contamination counts.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import multiprocessing
import os
import re
import site
import sys
import sysconfig
import time
from pathlib import Path

from training import corpus as C

# distributions derived from a validation package (same code under another name)
RELATIVES = ("httpx",)
MAX_SOURCE_BYTES = 12_000_000
MAX_TRAIN_BYTES = 320_000_000   # bounds prepare's time on the device (~0.2 s per MB there)
CARRY_FILE = "corpus.jsonl.xz"
# v5: the development machine's standard-library test suite travels (the image's stdlib has none;
# general-purpose testing code like the held-out packages'), as a training source of its own
STDLIB_TESTS = "python-stdlib-tests"
TEST_DIRS = {"test", "tests", "idle_test"}
# v5: the image's scientific / ML / numeric / GPU distributions. They were 179.5 of v4's 259.4 MB
# of training text (transformers, statsmodels, pandas, scikit-learn, scipy, numba, jax, sympy,
# matplotlib, numpy ... 4-12 MB each), while the held-out and validation packages are web, CLI,
# testing and parsing code. `build --group-max-bytes` caps each of these (0: v4's rule).
_SCIENTIFIC_NAMES = """
accelerate botorch chex contourpy cuda-core cuda-pathfinder cupy-cuda13x diffrax e3nn
einops equinox flax formulaic gpytorch h5py imageio jax jaxlib jaxtyping kernels
lightning lightning-utilities linear-operator lineax llvmlite matplotlib ml-dtypes mpmath
nanobind narwhals networkx numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir
onnxruntime onnxscript opencv-python-headless opt-einsum opt-einsum-fx optax optimistix
orbax-checkpoint pandas patsy peft pillow pyarrow pybind11 pytorch-lightning sacrebleu
safetensors scikit-image scikit-learn scipy seaborn sentence-transformers sentencepiece
statsmodels sympy tensorboard tensorstore tifffile timm tokenizers torch torch-geometric
torchaudio torchdiffeq torchmetrics torchvision transformers treescope triton xarray
"""
SCIENTIFIC = tuple(_SCIENTIFIC_NAMES.split())


def norm_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip().lower())


EXCLUDED_KEYS = {norm_key(k) for k in (*C.HELDOUT, *C.VALIDATION, *RELATIVES)}


def top_names(paths) -> set[str]:
    """Import names of `site-packages/<top>[/...]` paths: the package directory or module stem."""
    out = set()
    for p in paths:
        if p.startswith("site-packages/"):
            top = p[len("site-packages/"):].split("/")[0]
            out.add(top.removesuffix(".py"))
    return out


def path_hits(path: str, names: set[str]) -> bool:
    """`path` (site-packages/... or stdlib/...) is, or is inside, a module named in `names`."""
    parts = path.split("/")[1:]
    if not parts:
        return False
    top = parts[0].removesuffix(".py")
    return top in names or any(d in names for d in parts[1:-1])


# ---- the carry (development machine) -------------------------------------------------------

def is_stdlib_test(path: str) -> bool:
    """`stdlib/...` path inside a test directory (stdlib/test/, .../tests/, idlelib/idle_test/)."""
    parts = path.split("/")
    return parts[0] == "stdlib" and any(d in TEST_DIRS for d in parts[1:-1])


def make_carry(src: Path, device_packages: Path, out: Path, stdlib_tests: bool = False) -> dict:
    """Held-out + validation files and the training files of sources absent from the device's
    package list, from a built corpus (corpus.jsonl or .jsonl.xz + manifest.json).
    `stdlib_tests`: also the standard library's test files, as the source `STDLIB_TESTS` (the
    image's stdlib has no test suite, so nothing there replaces them)."""
    present = {norm_key(x) for line in device_packages.read_text().splitlines()
               if not line.lstrip().startswith("#") for x in line.split()}
    manifest = json.loads((src / "manifest.json").read_text())
    plain = src / "corpus.jsonl"
    opener = open if plain.is_file() else lzma.open
    kept: dict[str, dict] = {}
    out.mkdir(parents=True, exist_ok=True)
    with opener(plain if plain.is_file() else src / CARRY_FILE, "rt", encoding="utf-8") as f, \
            lzma.open(out / CARRY_FILE, "wt", encoding="utf-8", preset=9) as w:
        for line in f:
            r = json.loads(line)
            if stdlib_tests and r["split"] == "train" and r["source"] == C.STDLIB \
                    and is_stdlib_test(r["path"]):
                r["source"] = STDLIB_TESTS
                line = json.dumps(r) + "\n"
            elif r["split"] == "train" and (r["source"] == C.STDLIB
                                            or norm_key(r["source"]) in present):
                continue  # the device has its own copy (another version): read there
            w.write(line if line.endswith("\n") else line + "\n")
            k = kept.setdefault(r["source"], {"split": r["split"], "files": 0, "bytes": 0})
            k["files"] += 1
            k["bytes"] += len(r["text"].encode())
    by_name = {s["name"]: s for s in manifest["sources"]}
    if STDLIB_TESTS in kept and C.STDLIB in by_name:
        by_name[STDLIB_TESTS] = {**by_name[C.STDLIB], "name": STDLIB_TESTS}
    carry = {"from": str(src), "device_packages": sorted(present),
             "heldout_packages": manifest["heldout_packages"],
             "validation_packages": manifest["validation_packages"],
             "python": manifest.get("python"),
             "sources": [{**{k: by_name.get(n, {}).get(k) for k in ("name", "version", "licence",
                                                                     "spdx", "role")},
                          "name": n, **v} for n, v in sorted(kept.items())]}
    (out / "carry_manifest.json").write_text(json.dumps(carry, indent=2) + "\n")
    return {s: kept[s]["bytes"] for s in kept}


# ---- the build (training machine) ----------------------------------------------------------

def site_dirs(extra: list[Path]) -> list[Path]:
    """This interpreter's site directories holding *.dist-info (purelib, platlib, site's), real
    paths, each once."""
    cands = [*extra]
    if not extra:
        cands += [Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")]
        try:
            cands += [Path(p) for p in site.getsitepackages()]
        except AttributeError:  # a virtualenv's old site.py
            pass
        cands += [Path(site.getusersitepackages())]
    out, seen = [], set()
    for p in cands:
        if p.is_dir():
            r = p.resolve()
            if r not in seen and any(r.glob("*.dist-info")):
                seen.add(r)
                out.append(r)
    return out


def _hash_job(job):
    """(index, text or None, skip reason, digest, minhash): read (or take) a file's text, apply
    the size / UTF-8 / long-line rules, hash it (in a worker process)."""
    i, path, text = job
    if text is None:
        text, why = C.read_text(Path(path))
        if text is None:
            return i, None, why, None, None
    return i, text, "", C.normalized_digest(text), C.minhash(text, {})


def build(args) -> int:
    t_start = time.time()
    timing: dict[str, float] = {}

    def say(msg):
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    carry_man = json.loads((args.carry / "carry_manifest.json").read_text())
    with lzma.open(args.carry / CARRY_FILE, "rt", encoding="utf-8") as f:
        carried = [json.loads(line) for line in f]
    hv_paths = [r["path"] for r in carried if r["split"] in ("heldout", "val")]
    names = top_names(hv_paths) | {k.replace("-", "_") for k in EXCLUDED_KEYS}
    say(f"python {sys.version.split()[0]} at {sys.executable}; {os.cpu_count()} CPUs; carry: "
        f"{len(carried)} files ({sum(r['split'] == 'heldout' for r in carried)} held-out, "
        f"{sum(r['split'] == 'val' for r in carried)} validation); excluded import names: "
        f"{sorted(names)}")
    timing["carry_read_s"] = time.time() - t_start

    # the machine's sources
    dirs = site_dirs(args.site_packages)
    stdlib = args.stdlib or Path(sysconfig.get_paths()["stdlib"])
    say(f"stdlib {stdlib}; site directories {[str(d) for d in dirs]}")
    sources = [{"name": C.STDLIB, "key": C.STDLIB, "version": sys.version.split()[0],
                "licence": "PSF-2.0", "spdx": ["PSF-2.0"], "origin": "device",
                "files_listed": C.stdlib_files(stdlib), "vendored_files_skipped": 0}]
    seen_keys = set()
    for d in dirs:
        for s in C.distributions(d):
            if s["key"] in seen_keys:
                continue  # the first site directory on the path wins, as for imports
            seen_keys.add(s["key"])
            s["origin"] = "device"
            sources.append(s)
    device_keys = {norm_key(s["key"]) for s in sources}
    contamination = {"excluded_distributions": [], "files_dropped_by_module_name": 0,
                     "train_files_dropped_as_duplicates_of_heldout_or_val": 0}
    for s in sources:
        key = norm_key(s["key"])
        if key in EXCLUDED_KEYS:
            s["role"] = "excluded (a held-out / validation package or its relative: never read)"
            contamination["excluded_distributions"].append(f"{s['name']} {s['version']}")
            s["name"] = f"{s['name']} (the machine's copy)"  # not the carried source's name
        elif s["key"] in C.SKIP_DISTS:
            s["role"] = "skipped (our own repository)"
        elif not C.permissive(s["spdx"]):
            s["role"] = "excluded (licence)"
        else:
            s["role"] = "train"
    # the carried sources: held-out / validation always; training only where the machine has no
    # distribution of that name (else the machine's version is read)
    for cs in carry_man["sources"]:
        cs = dict(cs)
        cs.update(origin="carried", key=norm_key(cs["name"]), files_listed=[],
                  vendored_files_skipped=0)
        if cs["split"] == "train" and cs["key"] in device_keys:
            cs["role"] = "replaced by the machine's version"
            cs["name"] = f"{cs['name']} (carried, replaced)"
        else:
            cs["role"] = cs["split"]
        sources.append(cs)
    replaced = {norm_key(s["name"].split(" (carried")[0]) for s in sources
                if s["role"] == "replaced by the machine's version"}
    for s in sources:
        s["files"] = s["bytes"] = 0
    listing = [f"{s['name']} {s['version']} [{s['origin']}] {s['role']}" for s in sources]
    say(f"{len(sources)} sources:\n  " + "\n  ".join(listing))

    # jobs in priority order: carried held-out, validation, carried training, then the machine's
    # training files in sha1(path) order (what the time budget leaves out is a uniform sample)
    jobs, meta = [], []
    for r in carried:
        if r["split"] == "train" and norm_key(r["source"]) in replaced:
            continue
        meta.append({"split": r["split"], "source": r["source"], "path": r["path"]})
        jobs.append(r["text"])
    device_files = []
    for s in sources:
        if s["origin"] != "device" or s["role"] != "train":
            continue
        for path, p in s["files_listed"]:
            if path_hits(path, names):
                contamination["files_dropped_by_module_name"] += 1
                continue
            device_files.append((hashlib.sha1(path.encode()).hexdigest(), path, s["name"], p))
    device_files.sort()
    if args.max_files:
        device_files = device_files[:args.max_files]
    for _, path, name, p in device_files:
        meta.append({"split": "train", "source": name, "path": path})
        jobs.append(str(p))
    n_carried = len(jobs) - len(device_files)
    say(f"{n_carried} carried files, {len(device_files)} files of the machine to read "
        f"({contamination['files_dropped_by_module_name']} dropped by module name)")
    timing["listing_s"] = time.time() - t_start - sum(timing.values())

    # read + hash in parallel, bounded in time
    t0 = time.time()
    items, skipped, unread = [], {}, 0
    work = [(i, (jobs[i] if i >= n_carried else ""), (jobs[i] if i < n_carried else None))
            for i in range(len(jobs))]
    # forkserver, not fork: a fork of a process that runs threads (a test runner's, torch's) can
    # copy a held lock into the child, which then waits on it for ever; the project's CI hung
    # here for 90 minutes. The server forks workers from a clean single-threaded process.
    with multiprocessing.get_context("forkserver").Pool(args.workers) as pool:
        for k, (i, text, why, digest, sig) in enumerate(
                pool.imap(_hash_job, work, chunksize=8)):
            if text is None:
                skipped[why] = skipped.get(why, 0) + 1
            else:
                items.append({**meta[i], "text": text, "digest": digest, "minhash": sig})
            if i >= n_carried and time.time() - t0 > args.time_budget_s:
                unread = len(jobs) - k - 1
                say(f"time budget: {unread} files of the machine left unread")
                pool.terminate()
                break
    timing["read_and_hash_s"] = time.time() - t0
    say(f"{len(items)} files read and hashed in {timing['read_and_hash_s']:.1f}s with "
        f"{args.workers} processes; skipped {skipped}")

    # de-duplication, cap, doctest thinning, the size bound (training.corpus's rules)
    t0 = time.time()
    items.sort(key=lambda it: (C.SPLIT_RANK[it["split"]], it["path"]))
    dd = C.dedupe(items, say)
    hv = {it["path"] for it in items if it["split"] != "train"}
    contamination["train_files_dropped_as_duplicates_of_heldout_or_val"] = sum(
        1 for it in items if it["split"] == "train" and it["dup"]
        and it["dup"].split(": ", 1)[-1] in hv)
    before = C.training_shares(items)
    dd["capped"] = C.cap_sources(items, int(args.max_source_bytes))
    say(f"over the {args.max_source_bytes / 1e6:g} MB per-source cap: {dd['capped']} files")
    dd["group_capped"] = 0
    if args.group_max_bytes:  # v5: each source of the group (SCIENTIFIC) capped lower
        group = {norm_key(g) for g in args.group}
        dd["group_capped"] = C.cap_sources(
            [it for it in items if norm_key(it["source"]) in group], int(args.group_max_bytes))
        say(f"over the {args.group_max_bytes / 1e6:g} MB cap of the {len(group)} group sources "
            f"(scientific / ML): {dd['group_capped']} files")
    after_cap = C.training_shares(items)
    dd["doctests_thinned"] = C.thin_doctests(items, args.doctest_max_share)
    say(f"doctest-heavy files thinned: {dd['doctests_thinned']} dropped")
    total = sum(len(it["text"].encode()) for it in items
                if it["dup"] is None and it["split"] == "train")
    dd["over_total"] = 0
    if total > args.max_train_bytes:  # drop a uniform sample (path-hash order) past the bound
        keep = total
        for it in sorted((it for it in items if it["dup"] is None and it["split"] == "train"),
                         key=lambda it: hashlib.sha1(it["path"].encode()).hexdigest(),
                         reverse=True):
            if keep <= args.max_train_bytes:
                break
            keep -= len(it["text"].encode())
            it["dup"] = "total"
            dd["over_total"] += 1
    say(f"training text {total / 1e6:.1f} MB; over the {args.max_train_bytes / 1e6:g} MB bound: "
        f"{dd['over_total']} files")
    shares = {"before_cap": before, "after_cap": after_cap,
              "after_doctest_thinning": C.training_shares(items)}
    C.say_shares(say, "kept", shares["after_doctest_thinning"])
    timing["dedupe_cap_s"] = time.time() - t0

    # the final check (4.)
    hv_digests = {it["digest"] for it in items if it["split"] != "train"}
    bad = [it["path"] for it in items if it["dup"] is None and it["split"] == "train" and (
        path_hits(it["path"], names) or norm_key(it["source"]) in EXCLUDED_KEYS
        or it["digest"] in hv_digests)]
    contamination["check"] = "passed" if not bad else f"FAILED: {bad[:5]}"
    say(f"contamination: {contamination}")

    t0 = time.time()
    for it in items:
        it.pop("minhash", None)
        it.pop("digest", None)
    ns = argparse.Namespace(out=args.out, max_source_bytes=args.max_source_bytes,
                            doctest_max_share=args.doctest_max_share)
    for s in sources:
        s.setdefault("spdx", [])
    C.finish(ns, sources, items, skipped, dd, say, shares)
    man = json.loads((args.out / "manifest.json").read_text())
    by_name = {s["name"]: s for s in sources}
    for s in man["sources"]:
        s["origin"] = by_name[s["name"]].get("origin")
    timing["write_s"] = time.time() - t0
    timing["total_s"] = time.time() - t_start
    man["device_build"] = {
        "python": sys.version.split()[0], "executable": sys.executable, "cpus": os.cpu_count(),
        "workers": args.workers, "stdlib": str(stdlib), "site_dirs": [str(d) for d in dirs],
        "time_budget_s": args.time_budget_s, "files_left_unread": unread,
        "max_train_bytes": args.max_train_bytes, "timing_s": timing,
        "group_max_bytes": args.group_max_bytes,
        "group": sorted(args.group) if args.group_max_bytes else [],
        "contamination": contamination, "excluded_import_names": sorted(names),
        "relatives_excluded": list(RELATIVES), "carry": str(args.carry)}
    (args.out / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")
    say(f"timing {json.dumps({k: round(v, 1) for k, v in timing.items()})}")
    return 0 if not bad else 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pc = sub.add_parser("carry", help="(development machine) the small carry")
    pc.add_argument("--from", dest="src", type=Path, required=True, help="a built corpus dir")
    pc.add_argument("--device-packages", type=Path, required=True,
                    help="the image's distribution names, one per line or space-separated")
    pc.add_argument("--out", type=Path, required=True)
    pc.add_argument("--stdlib-tests", action="store_true",
                    help=f"also carry the standard library's test files (as {STDLIB_TESTS})")
    pb = sub.add_parser("build", help="(training machine) the corpus from its own Python")
    pb.add_argument("--carry", type=Path, required=True)
    pb.add_argument("--out", type=Path, required=True)
    pb.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    pb.add_argument("--time-budget-s", type=float, default=90.0,
                    help="reading and hashing stop after this long (the rest is left out)")
    pb.add_argument("--site-packages", type=Path, nargs="*", default=[],
                    help="site directories to read (default: this interpreter's)")
    pb.add_argument("--stdlib", type=Path, default=None)
    pb.add_argument("--max-source-bytes", type=float, default=MAX_SOURCE_BYTES)
    pb.add_argument("--max-train-bytes", type=float, default=MAX_TRAIN_BYTES)
    pb.add_argument("--doctest-max-share", type=float, default=C.DOCTEST_MAX_SHARE)
    pb.add_argument("--group-max-bytes", type=float, default=0,
                    help="cap each source of --group at this many bytes (0: no group cap)")
    pb.add_argument("--group", nargs="*", default=list(SCIENTIFIC),
                    help="the capped group's distribution names (default: SCIENTIFIC)")
    pb.add_argument("--max-files", type=int, default=None,
                    help="read only the first N of the machine's files (dry runs)")
    args = ap.parse_args(argv)
    if args.cmd == "carry":
        kept = make_carry(args.src, args.device_packages, args.out, args.stdlib_tests)
        print(json.dumps({"sources": len(kept), "bytes": sum(kept.values()),
                          "xz_bytes": (args.out / CARRY_FILE).stat().st_size}))
        return 0
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
