"""Is a FIM miss a search error or a model error? (tiny-coder v4, issue 36)

For each case where the greedy middle's first line differs from the removed line, score both as
the model was trained to write a middle: `line + "\\n" + <eos>` after the FIM prompt, the total
log-probability (float32 engine, `evals.engine.sequence_logits`). If the removed line scores
higher than what greedy wrote, a better search (beam, best-of) could find it: a search error.
If it scores lower, the model prefers its wrong line: no decoding fixes it.

    python bench/results/tiny_coder_v4_fim/fim_search_or_model.py \
        --val-list bench/results/tiny_coder_v3_decoding/validation_files.txt --val-fim 128 \
        --out fim_search_or_model.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

sys.path.insert(0, ".")

from evals import cli, code
from evals.data import fim_cases, load_heldout
from evals.engine import build_engine, sequence_logits


def middle_logprob(engine, tok, prompt: list[int], line: str) -> float:
    mid = tok.encode(line + "\n", add_special_tokens=False) + list(tok.eos_token_ids[:1])
    logits = sequence_logits(engine, prompt + mid)
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
    return float(lp[torch.arange(len(mid)), torch.tensor(mid)].sum())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tiny-coder")
    ap.add_argument("--val-list", required=True)
    ap.add_argument("--val-fim", type=int, default=128)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    args = cli.build_parser().parse_args(["code", "--model", a.model, "--dtype", "float32",
                                          "--cpu-threads", "2"])
    engine, loaded = build_engine(a.model, cli._settings(args), dataclasses.replace(
        cli._shape(args), max_model_len=2048))
    tok = loaded.tokenizer
    val = load_heldout(a.val_list).files
    held = load_heldout(code.default_heldout_list(a.model)).files
    report = {}
    for name, cases in (("heldout_fim", fim_cases(held, 32, 0)),
                        ("val_fim", fim_cases(val, a.val_fim, 0))):
        r = code.fim_lines(engine, tok, cases, 32, None)
        rows = []
        for c, shown in zip(cases, r["cases"]):
            if shown["match"]:
                continue
            prompt = tok.encode(code.fim_prompt(c))
            want = middle_logprob(engine, tok, prompt, c.middle)
            got = middle_logprob(engine, tok, prompt, shown["got"])
            rows.append({"function": c.function, "expected": c.middle, "got": shown["got"],
                         "similarity": shown["similarity"],
                         "copies_a_neighbour": shown["copies_a_neighbour"],
                         "logprob_expected": round(want, 3), "logprob_greedy": round(got, 3),
                         "search_error": want > got})
        n_search = sum(x["search_error"] for x in rows)
        report[name] = {"cases": len(cases), "exact": r["exact"], "misses": len(rows),
                        "search_errors": n_search, "model_errors": len(rows) - n_search,
                        "rows": rows}
        print(f"{name}: exact {r['exact']}/{len(cases)}; of {len(rows)} misses, the removed line "
              f"is more likely than greedy's in {n_search} (search errors), less likely in "
              f"{len(rows) - n_search} (model errors)", flush=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
