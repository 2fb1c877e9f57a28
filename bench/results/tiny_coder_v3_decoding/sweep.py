"""Decoding-defaults sweep for tiny-coder v3 (issue 36): one engine, every decoding on the same
prompts, through the evaluation's own functions (`evals.code.header_completions`, `fim_lines`,
the stop and parse rules unchanged; greedy budget 256 tokens per header, 32 per FIM middle).

Sets, per decoding:
  CHOICE (what the defaults are chosen on): the validation packages (fsspec, anyio, pyparsing,
    httpx2, h11; the corpus's 156 validation files, never the held-out ones): 56 evenly spaced
    function headers (`evals.data.heldout_headers`) and 32 FIM cases (`evals.data.fim_cases`,
    seed 0); plus the 8 fixed headers (`evals.code.HEADERS`, generic prompts, not held-out data).
  TEST (reported, not used to choose): the held-out set exactly as `tidegate eval code
    --files-sample 8 --fim-cases 32` builds it: 8 held-out-function headers, 32 FIM cases.

A completion "runs to the budget" when none of <eos>, a stop string or the function's end came
within 256 tokens (judge_header's finish == "length"); "repeats" counts the most frequent
non-blank line of its body (>= 3: a loop of lines).

    python bench/results/tiny_coder_v3_decoding/sweep.py --val-list VAL.txt --out sweep.jsonl \
        [--configs 'rp=1.1,fp=0.2' 'rp=1.0,fp=0.4' ...]
    stage 2 (a disjoint validation set: 150 evenly spaced headers minus stage 1's 56):
    ... --val-headers 150 --val-skip-first 56 --out sweep_stage2.jsonl --configs ...
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

sys.path.insert(0, ".")
import dataclasses

from backend.runner.sampler import SamplingParams
from evals import cli, code
from evals.data import fim_cases, heldout_headers, load_heldout, spaced_indices  # noqa: F401
from evals.engine import build_engine

KEYS = {"rp": "repetition_penalty", "fp": "frequency_penalty", "pp": "presence_penalty"}


def parse_config(text: str) -> dict:
    out = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=")
        out[KEYS[k]] = float(v)
    return out


def max_repeat(body: str) -> int:
    lines = [ln.strip() for ln in body.split("\n") if ln.strip()]
    return max(Counter(lines).values(), default=0)


def summarize(r: dict) -> dict:
    rows = r["rows"]
    return {"parsed": r["parsed"], "total": r["total"],
            "length": sum(x["finish"] == "length" for x in rows),
            "length_looping": sum(x["finish"] == "length" and max_repeat(x["body"]) >= 3
                                  for x in rows),
            "looping_any": sum(max_repeat(x["body"]) >= 3 for x in rows),
            "rows": [{"header": x["header"], "finish": x["finish"], "parses": x["parses"],
                      "lines": x["lines"], "max_repeat": max_repeat(x["body"]),
                      "body": x["body"]} for x in rows]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tiny-coder")
    ap.add_argument("--val-list", required=True)
    ap.add_argument("--val-headers", type=int, default=56)
    ap.add_argument("--val-skip-first", type=int, default=0,
                    help="leave out the headers of the N-header set (stage 2: a disjoint set)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", nargs="+", default=["", "rp=1.1,fp=0.2"])
    ap.add_argument("--cpu-threads", default="2")
    a = ap.parse_args()
    args = cli.build_parser().parse_args(["code", "--model", a.model, "--dtype", "float32",
                                          "--cpu-threads", a.cpu_threads])
    shape = cli._shape(args)
    engine, loaded = build_engine(a.model, cli._settings(args), dataclasses.replace(
        shape, max_model_len=2048))
    tok = loaded.tokenizer
    val = load_heldout(a.val_list).files
    held = load_heldout(code.default_heldout_list(a.model)).files
    skip = {c["header"] for c in heldout_headers(val, a.val_skip_first)} if a.val_skip_first \
        else set()
    sets = {"val_headers": [c["header"] for c in heldout_headers(val, a.val_headers)
                            if c["header"] not in skip],
            "fixed_headers": list(code.HEADERS),
            "heldout_headers": [c["header"] for c in heldout_headers(held, 8)]}
    fims = {"val_fim": fim_cases(val, 32, 0), "heldout_fim": fim_cases(held, 32, 0)}
    print(f"val files {len(val)}, held-out files {len(held)}; "
          f"{ {k: len(v) for k, v in sets.items()} }", flush=True)
    with open(a.out, "a") as f:
        for cfg_text in a.configs:
            cfg = parse_config(cfg_text)
            params = SamplingParams(seed=0, temperature=0.0, **cfg) if cfg else None
            t0 = time.perf_counter()
            rec = {"config": cfg_text or "greedy", **cfg}
            for name, headers in sets.items():
                rec[name] = summarize(code.header_completions(engine, tok, headers,
                                                              params=params))
            for name, cases in fims.items():
                r = code.fim_lines(engine, tok, cases, 32, params)
                rec[name] = {"exact": r["exact"], "similarity": r["mean_line_similarity"],
                             "stopped_with_eos": r["stopped_with_eos"]}
            rec["seconds"] = time.perf_counter() - t0
            f.write(json.dumps(rec) + "\n")
            f.flush()
            def s(k, rec=rec):
                return f"{rec[k]['parsed']}/{rec[k]['total']} len {rec[k]['length']}"
            print(f"{rec['config']:>22}: val {s('val_headers')} | fixed {s('fixed_headers')} | "
                  f"held {s('heldout_headers')} | valFIM {rec['val_fim']['exact']} "
                  f"{rec['val_fim']['similarity']:.3f} | heldFIM {rec['heldout_fim']['exact']} "
                  f"{rec['heldout_fim']['similarity']:.3f} | {rec['seconds']:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
