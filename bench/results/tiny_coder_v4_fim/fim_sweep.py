"""FIM decoding sweep for tiny-coder v4 (issue 36): does the server's default decoding (its
generation_config.json penalties) cost FIM, and would another decoding for FIM requests do better?

One engine, every decoding on the same prompts, through the evaluation's own `evals.code.fim_lines`
(the stop and judge rules unchanged: 32 tokens, middle cut at <eos>, its first line compared).

  CHOICE: N validation FIM cases (`evals.data.fim_cases(val, N, seed 0)` over the corpus's 156
    validation files: fsspec, anyio, pyparsing, httpx2, h11; never the held-out packages).
  TEST (reported, not used to choose): the 32 held-out cases `tidegate eval code --fim-cases 32`
    builds.

A config is `rp=1.1,fp=0.4` (repetition / frequency / presence penalty); a trailing `,out`
applies the repetition penalty to the output tokens only (the prompt's tokens are not
penalized; emulated here by handing the CPU penalty kernel an empty prompt history), to test
whether penalizing the FIM prompt (the code around the hole) is what costs FIM.

    python bench/results/tiny_coder_v4_fim/fim_sweep.py \
        --val-list bench/results/tiny_coder_v3_decoding/validation_files.txt --val-fim 128 \
        --out fim_sweep.jsonl --configs "" "rp=1.1,fp=0.4" "rp=1.1,fp=0.4,out" "fp=0.4" ...
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

sys.path.insert(0, ".")

from backend.runner import sampler
from backend.runner.sampler import SamplingParams
from evals import cli, code
from evals.data import fim_cases, load_heldout
from evals.engine import build_engine

KEYS = {"rp": "repetition_penalty", "fp": "frequency_penalty", "pp": "presence_penalty"}
_KERNEL = sampler.apply_penalties_cpu
OUTPUT_ONLY = {"on": False}


def _penalties(logits, histories, repetition, presence, frequency):
    if OUTPUT_ONLY["on"]:
        (_, p_off), outputs = histories
        histories = ((np.zeros(0, dtype=np.int64), np.zeros_like(p_off)), outputs)
    return _KERNEL(logits, histories, repetition, presence, frequency)


sampler.apply_penalties_cpu = _penalties


def parse_config(text: str) -> tuple[dict, bool]:
    out, output_only = {}, False
    for part in filter(None, text.split(",")):
        if part == "out":
            output_only = True
            continue
        k, v = part.split("=")
        out[KEYS[k]] = float(v)
    return out, output_only


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tiny-coder")
    ap.add_argument("--val-list", required=True)
    ap.add_argument("--val-fim", type=int, default=128)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", nargs="+", default=["", "rp=1.1,fp=0.4"])
    ap.add_argument("--cpu-threads", default="2")
    a = ap.parse_args()
    args = cli.build_parser().parse_args(["code", "--model", a.model, "--dtype", "float32",
                                          "--cpu-threads", a.cpu_threads])
    engine, loaded = build_engine(a.model, cli._settings(args), dataclasses.replace(
        cli._shape(args), max_model_len=2048))
    tok = loaded.tokenizer
    val = load_heldout(a.val_list).files
    held = load_heldout(code.default_heldout_list(a.model)).files
    fims = {"val_fim": fim_cases(val, a.val_fim, 0), "heldout_fim": fim_cases(held, 32, 0)}
    print(f"val files {len(val)}, held-out files {len(held)}; "
          f"{ {k: len(v) for k, v in fims.items()} }", flush=True)
    with open(a.out, "a") as f:
        for cfg_text in a.configs:
            cfg, output_only = parse_config(cfg_text)
            OUTPUT_ONLY["on"] = output_only
            params = SamplingParams(seed=0, temperature=0.0, **cfg) if cfg else None
            t0 = time.perf_counter()
            rec = {"config": cfg_text or "greedy", "output_only": output_only, **cfg}
            for name, cases in fims.items():
                r = code.fim_lines(engine, tok, cases, 32, params)
                rec[name] = {"exact": r["exact"], "total": r["total"],
                             "similarity": r["mean_line_similarity"],
                             "stopped_with_eos": r["stopped_with_eos"],
                             "copies_a_neighbour": r["copies_a_neighbour"],
                             "cases": [{k: c[k] for k in ("function", "expected", "got",
                                                          "match", "similarity",
                                                          "copies_a_neighbour")}
                                       for c in r["cases"]]}
            rec["seconds"] = time.perf_counter() - t0
            f.write(json.dumps(rec) + "\n")
            f.flush()
            v, h = rec["val_fim"], rec["heldout_fim"]
            print(f"{rec['config']:>24}: val {v['exact']}/{v['total']} {v['similarity']:.3f} "
                  f"copies {v['copies_a_neighbour']} | held {h['exact']}/{h['total']} "
                  f"{h['similarity']:.3f} copies {h['copies_a_neighbour']} | "
                  f"{rec['seconds']:.0f}s", flush=True)
    OUTPUT_ONLY["on"] = False
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
