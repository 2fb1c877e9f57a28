"""Issue 35, session 39: every part of the grid state replayed in three forms of the power cap, without the
ceiling draws (the intervals and means do not depend on them), and the cells inside per part and per pooled cell.

Forms (`validate_replay` flags): default (the cap by step kind with decode spells, sustained anchors), stream
(`--cap-anchors stream`: the cap's anchors from the profile's stream_kind runs), stream_fast (that and `--cap-onset
fast`: the limiter's fast onset, which counts no decode spells), fast (the fast onset on the sustained anchors). Why: on the 33B cells the default form charges
steps with prefill a flat ~7 % over the paused profile at every load where live rises 5 -> 8 % (steps_by_run.txt);
stream_fast has the live slope. Which form wins over the whole grid decides a default, not one cell.

    python bench/results/pairs_s39/forms_grid.py [--jobs 2] [PART ...]   # ~25 min on 2 cores; writes forms/
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STATE = ROOT / "bench/results/fidelity_grid_state"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
FORMS = {"default": [], "stream": ["--cap-anchors", "stream"],
         "stream_fast": ["--cap-anchors", "stream", "--cap-onset", "fast"], "fast": ["--cap-onset", "fast"]}
# run.sh's pooled cells (several calls' seeds, one table)
POOLS = {"33b-5seeds": ("33b-s11", "33b-s13"), "6.7b-mixed-s25-5seeds": ("6.7b-mixed-s25", "6.7b-mixed-s25-4"),
         "33b-mixed-s25-3seeds": ("33b-mixed-s25-1", "33b-mixed-s25-2"),
         "h100-6.7b-fp8-10seeds": ("h100-6.7b-fp8-s33", "h100-6.7b-fp8-s35"),
         "h100-6.7b-6seeds": ("h100-6.7b-s34", "h100-6.7b-s35"),
         "h100-33b-kvint4-5seeds": ("h100-33b-kvint4-s38", "h100-33b-kvint4-s38-2"),
         "h100-33b-5seeds": ("h100-33b-s39", "h100-33b-s39-2")}


def sources() -> dict[str, Path]:
    text = (STATE / "run.sh").read_text()
    return {m.group(1): (STATE.parent / m.group(2)) for m in re.finditer(r"^\s*\[([^\]]+)\]=(\S+)", text, re.MULTILINE)}


def replay(part: str, folder: Path, form: str, out: Path) -> Path:
    name = folder.name
    dst = out / f"replay_{part}_{form}.json"
    if dst.exists():
        return dst
    cmd = [sys.executable, "-m", "bench.simulator.validate_replay", str(folder / f"validate_{name}.json"),
           str(folder / f"decisions_{name}.jsonl.gz"), str(folder / f"steps_{name}.jsonl.gz"),
           "--profile", str(folder / f"profile_{name}.json"), "--ceiling", "0", *FORMS[form], "--json", str(dst)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV, check=False)
    if done.returncode != 0:
        print(f"{part} {form}: failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
    return dst


def table(files: list[Path]) -> list[str]:
    cmd = [sys.executable, "-m", "bench.simulator.fidelity_table", *(["--pool"] if len(files) > 1 else []),
           *map(str, files)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV, check=False)
    return [ln for ln in done.stdout.splitlines() if re.search(r"\| 0\.(5|8|95)x \|", ln)]


def counts(rows: list[str]) -> tuple[int, int, int]:
    """(intervals inside, means inside, cells) over 0.5-0.95x: bold cells; a mean inside where |mean| is under the
    bound (P50 5, P99 10, throughput 2)."""
    bounds = (5, 10, 5, 10, 2)
    inside = means = 0
    for r in rows:
        cells = r.split("|")[7:12]
        for c, b in zip(cells, bounds):
            inside += "**" in c
            m = re.search(r"([+-]?\d+\.\d+)", c)
            means += bool(m) and abs(float(m.group(1))) <= b
    return inside, means, 5 * len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("parts", nargs="*")
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args(argv)
    src = sources()
    parts = a.parts or list(src)
    out = HERE / "forms"
    out.mkdir(exist_ok=True)
    jobs = [(q, src[q], f) for q in parts for f in FORMS]
    with ThreadPoolExecutor(a.jobs) as ex:
        list(ex.map(lambda j: replay(j[0], j[1], j[2], out), jobs))
    lines = ["| cell | " + " | ".join(f"{f}: intervals / means" for f in FORMS) + " |",
             "|---|" + "---|" * len(FORMS)]
    cells = [(q, (q,)) for q in parts] + [(n, qs) for n, qs in POOLS.items() if all(q in parts for q in qs)]
    result = {}
    for name, qs in cells:
        row = []
        for f in FORMS:
            files = [out / f"replay_{q}_{f}.json" for q in qs]
            if not all(x.exists() for x in files):
                row.append("-")
                continue
            i, m, n = counts(table(files))
            result.setdefault(name, {})[f] = [i, m, n]
            row.append(f"{i} / {m} of {n}")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    text = "\n".join(lines)
    (out / "counts.md").write_text(text + "\n")
    (out / "counts.json").write_text(json.dumps(result, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
