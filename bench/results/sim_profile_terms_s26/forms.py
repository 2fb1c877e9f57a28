"""Issue 35, session 26: `sim run`'s spec (`sims.options.spec_from_args`, as `sim run / sweep / search /
agent` build it) on a grid part's profile at the part's live rates, seeds and lengths (the
validate's draws, capped at 4x their mean), in three forms: `--profile-terms off` (what those
commands charged before this session: the bare profile, no prefill cap unless given), off with the
CUDA engine's 256-token cap given, and auto (the default now: `sims.profile_terms`). Mean P50 / P99
error against the live runs over the part's seeds. Run from the repo root:

    python bench/results/sim_profile_terms_s26/forms.py PART_DIR
"""
import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.simulator.validate import length_spec
from sims.options import add_run_args, parse_with_config, spec_from_args
from sims.report import summarize
from sims.runner import simulate_spec

FORMS = {"off (before)": ["--profile-terms", "off"],
         "off, cap given": ["--profile-terms", "off", "--max-prefill-tokens-while-decoding", "256"],
         "auto": []}


def main(part: str) -> None:
    part = part.rstrip("/")
    tag = part.split("/")[-1]
    doc = json.loads(Path(f"{part}/validate_{tag}.json").read_text())
    prof, lb, cfg = doc["profile"], doc["live_backend"], doc["config"]
    for load in doc["loads"]:
        if load["load_label"] not in ("0.5x", "0.8x", "0.95x"):
            continue
        for name, extra in FORMS.items():
            errs = []
            for run in load["runs"]:
                p = argparse.ArgumentParser()
                add_run_args(p)
                a = parse_with_config(p, [
                    "--profile", f"{part}/profile_{tag}.json", "--rate", str(load["rate"]),
                    "--num-requests", str(cfg["num_requests"]), "--input-len", cfg["input_len"],
                    "--output-len", cfg["output_len"], "--seed", str(run["seed"]),
                    "--max-num-seqs", str(prof["max_num_seqs"]),
                    "--max-num-batched-tokens", str(prof["max_num_batched_tokens"]),
                    "--num-blocks", str(lb["num_kv_blocks"]), "--max-model-len", str(lb["max_model_len"]),
                    "--prefix-caching", "on", *extra])
                s = spec_from_args(a)
                s = replace(s, workload=replace(s.workload, input_len=length_spec(cfg["input_len"]),
                                                output_len=length_spec(cfg["output_len"])))
                rep, live = summarize(simulate_spec(s)), run["live"]
                errs.append([rep[m][q] / live[m][q] - 1 for q in ("p50", "p99") for m in ("ttft_ms", "tpot_ms")])
            e = 100 * np.array(errs).mean(axis=0)
            print(f"{tag} {load['load_label']:5s} {name:15s} TTFT P50 {e[0]:+6.1f}  TPOT P50 {e[1]:+6.1f}  "
                  f"TTFT P99 {e[2]:+6.1f}  TPOT P99 {e[3]:+6.1f}  ({len(errs)} seeds)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
