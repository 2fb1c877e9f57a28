"""Issue 35, session 32: why do the profile's decode-bucket points read ~1.5 % under the other harnesses?

On the H100 6.7B FP8 the profile's decode points measured in its decode-bucket pass (`decode_bucket_shapes`:
d = 9, 10, 17, 18, 24-26, 33, 34, 48-50, ..., measured one after another at the end of the grid, each d at its
three contexts in turn) read ~1.5 % under the same shapes timed on the same machine by replay_live's `paused()`
over `build_step` chunks and by bench/results/fidelity_h100fp8_s29/decode_checks.py, while the grid pass's decode
points (d = 1, 2, 4, ..., 64, each measured right after paused mixed points) agree with them. This runs the same
decode shapes (d in DS, equal contexts, the reported one 576: the grid's middle context) six ways in one process,
over a pool filled as the profile fills it (`fill_kv_pool(runner, "random")`), to find the condition that reads low:

  bucket_order    the profile's bucket pass exactly: for each d, the point at every context in CS in turn, each
                  timed as the profile times a point (`profile_point`: `measure` with the profile's repeats and
                  warm-up, no pause; the SM clock; `measure_device` with its repeats, no pause); the median
                  device ms at 576 is the pass's figure (the other contexts are kept too)
  single_c        the same per-point procedure at 576 only (the neighbouring contexts' points left out)
  after_mixed     each d right after 3 paused device-timed repetitions (`--pause-ms` each, as the grid pass
                  times its mixed points) of the mixed step d decodes + min(1,024, budget - d) prefill tokens
                  at context 512, then `profile_point` at 576 (the grid pass's order)
  rotated_tables  3 single device-timed runs, each with every block-table entry shifted by k x offset (k = 1, 2,
                  3; offset = the step's decode blocks, d x ceil(576 / block_size)) modulo the pool: no
                  repetition reads a block an earlier one read (the profile's repetitions all read blocks from 0)
  replay_paused   3 runs of replay_live's `paused(runner, build_step([576] * d, [], ...), 0.03, 1)`, seeds 1-3
                  (the harness the profile's bucket points disagree with): the reference of the ratios
  bucket_order_2  the first pass again (drift over the call)

Each pass records per d its ms, the SM clock and the board power after it; then each pass over replay_paused per
d. The per-point procedure's repetitions default to what the H100 profiles in question were measured with (`sim
validate --profile-repeats 3 --profile-warmup 1`, pause 60 ms: scripts/fidelity_h200.sh; their profile JSONs'
points carry repeats 3, pause_ms 60); the profile CLI's own defaults are `--repeats 5 --warmup 2 --pause-ms 0`.

    python bench/results/decode_same_machine_s32/bucket_pass_check.py --model deepseek-coder-6.7b --device cuda \\
        --quantization fp8 --out bucket_pass_check.json
    python bench/results/decode_same_machine_s32/bucket_pass_check.py --model tiny --device cpu \\
        --out /tmp/bpc.json --ds 2,3,4 --contexts 32,48,64          # dry run (wall ms: no timing events)
"""
import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch

from backend.engine.args import add_engine_args, backend_config, int_list
from backend.engine.assemble import ServingOptions, create_engine
from bench.engine.profile import (
    fill_kv_pool,
    make_step,
    measure,
    measure_device,
    power_w,
    sm_clock_mhz,
)
from bench.engine.replay_live import build_step, paused
from bench.simulator.validate import CUDA_PROFILE_PAUSE_MS

DS = (16, 17, 24, 25, 32, 33, 48, 64)
CS = (512, 576, 640)
MIXED = (1024, 512)  # the grid pass's mixed step before a decode point: prefill tokens (capped), context
# the repetitions of the profiles that read the bucket points low (scripts/fidelity_h200.sh's sim validate)
PROFILE_REPEATS, PROFILE_WARMUP = 3, 1
REPLAY_PAUSE_S = 0.03  # scripts/gpu_decode_same_machine.sh's paused replay (--pause-ms 30)
RUNS = 3  # rotated_tables / replay_paused runs per d
PASSES = ("bucket_order", "single_c", "after_mixed", "rotated_tables", "replay_paused", "bucket_order_2")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--quantization", default="none", choices=["none", "fp8"])
    p.add_argument("--ds", default=",".join(map(str, DS)), help="comma-separated decode batches")
    p.add_argument("--contexts", default=",".join(map(str, CS)),
                   help="comma-separated contexts of the bucket pass; the reported one is the middle")
    p.add_argument("--repeats", type=int, default=PROFILE_REPEATS,
                   help="a point's timed repetitions, `measure` and `measure_device` each")
    p.add_argument("--warmup", type=int, default=PROFILE_WARMUP, help="a point's untimed repetitions")
    p.add_argument("--pause-ms", type=float, default=CUDA_PROFILE_PAUSE_MS,
                   help="idle before each repetition of the mixed step (after_mixed)")
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    engine, loaded = create_engine(backend_config(a), ServingOptions(quantization=a.quantization))
    runner, cfg = engine.runner, engine.config
    vocab, bs, nb = loaded.config.vocab_size, cfg.block_size, cfg.num_blocks
    cuda = runner.device.type == "cuda"
    kv_fill = fill_kv_pool(runner, "random")
    cs = [c for c in int_list(a.contexts) if c <= cfg.max_model_len]
    if not cs:
        raise SystemExit("bucket_pass_check: no context fits max_model_len")
    c_rep = cs[len(cs) // 2]
    ds = [d for d in int_list(a.ds) if d <= cfg.max_num_seqs and d * -(-max(cs) // bs) < nb]
    if not ds:
        raise SystemExit("bucket_pass_check: no decode batch fits this engine")
    dec = {(d, c): make_step(d, 0, c, bs, nb, vocab) for d in ds for c in cs}
    mix, mix_tokens = {}, {}
    for d in ds:
        mp = min(MIXED[0], cfg.max_num_batched_tokens - d)
        if mp >= 1:
            mix[d], mix_tokens[str(d)] = make_step(d, mp, MIXED[1], bs, nb, vocab, 1, 0), mp
    offsets = {d: d * -(-c_rep // bs) for d in ds}

    def shifted(chunks, by: int) -> list:
        return [dataclasses.replace(ch, block_table=[(b + by) % nb for b in ch.block_table])
                for ch in chunks]

    rot = {d: [shifted(dec[d, c_rep], k * offsets[d]) for k in range(1, RUNS + 1)] for d in ds}
    rep = {d: [build_step([c_rep] * d, [], bs, nb, vocab, seed=k) for k in range(1, RUNS + 1)]
           for d in ds}
    for chunks in [*dec.values(), *mix.values(), *(x for v in rot.values() for x in v),
                   *(x for v in rep.values() for x in v)]:  # warm-up: graphs, allocator
        runner.finish(runner.launch(chunks))
    if cuda:
        torch.cuda.synchronize()

    def profile_point(chunks) -> float:
        """The profile's per-point procedure (bench.engine.profile.run, a decode-only point): the
        median device ms (wall ms from `measure` where the step has no timing events)."""
        launch_ms: list[float] = []
        ms = measure(runner, chunks, a.repeats, a.warmup, 0.0, launch_ms)
        sm_clock_mhz(runner.device)
        dev = measure_device(runner, chunks, a.repeats, 0.0)
        return statistics.median(dev if dev else ms)

    def one_run(chunks, reps: int = 1, pause_s: float = 0.0) -> float:
        dev = measure_device(runner, chunks, reps, pause_s)
        return statistics.median(dev if dev else measure(runner, chunks, reps, 0, pause_s))

    def state() -> dict:
        return {"sm_clock_mhz": sm_clock_mhz(runner.device), "power_w": power_w(runner.device)}

    out = {"device_name": torch.cuda.get_device_name(runner.device) if cuda else "cpu",
           "timed_on_device": cuda, "model": a.model, "quantization": a.quantization,
           "kv_fill": kv_fill, "block_size": bs, "num_blocks": nb, "max_num_seqs": cfg.max_num_seqs,
           "max_num_batched_tokens": cfg.max_num_batched_tokens, "ds": ds, "contexts": cs,
           "context": c_rep, "repeats": a.repeats, "warmup": a.warmup, "pause_ms": a.pause_ms,
           "mixed_prefill_tokens": mix_tokens, "mixed_context": MIXED[1],
           "rotated_offsets_blocks": {str(d): offsets[d] for d in ds},
           # the runs' blocks are disjoint where RUNS offsets fit the pool
           "rotated_disjoint": {str(d): RUNS * offsets[d] <= nb for d in ds},
           "replay_pause_ms": REPLAY_PAUSE_S * 1000, "torch_version": torch.__version__, "passes": {},
           "pass_s": {}}
    print(f"device {out['device_name']}  kv_fill {kv_fill}  ds {ds}  contexts {cs} (reported {c_rep})  "
          f"repeats {a.repeats} warmup {a.warmup} pause {a.pause_ms:g} ms", flush=True)

    def run_pass(name: str) -> None:
        t0 = time.perf_counter()
        rec: dict[str, dict] = {}
        for d in ds:
            if name.startswith("bucket_order"):
                by_c = {str(c): profile_point(dec[d, c]) for c in cs}
                r = {"ms": by_c[str(c_rep)], "by_context": by_c}
            elif name == "single_c":
                r = {"ms": profile_point(dec[d, c_rep])}
            elif name == "after_mixed":
                r = {"mixed_ms": one_run(mix[d], 3, a.pause_ms / 1000)} if d in mix else {}
                r["ms"] = profile_point(dec[d, c_rep])
            elif name == "rotated_tables":
                runs = [one_run(chunks) for chunks in rot[d]]
                r = {"ms": statistics.median(runs), "runs": runs}
            else:  # replay_paused
                runs = [paused(runner, chunks, REPLAY_PAUSE_S, 1) for chunks in rep[d]]
                r = {"ms": statistics.median(runs), "runs": runs}
            rec[str(d)] = {**r, **state()}
        out["passes"][name] = rec
        out["pass_s"][name] = round(time.perf_counter() - t0, 2)
        print(f"{name:15s} " + "  ".join(f"d{d} {r['ms']:.3f}" for d, r in rec.items()), flush=True)

    for name in PASSES:
        run_pass(name)
    ref = out["passes"]["replay_paused"]
    out["over_replay_paused"] = {
        name: {d: round(r["ms"] / ref[d]["ms"], 4) for d, r in out["passes"][name].items()}
        for name in PASSES if name != "replay_paused"}
    print(f"over replay_paused (context {c_rep}):", flush=True)
    for name, ratios in out["over_replay_paused"].items():
        print(f"{name:15s} " + "  ".join(f"d{d} {x:.4f}" for d, x in ratios.items()), flush=True)
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} ({out['total_s']} s)", flush=True)
    return 0 if all(math.isfinite(x) and x > 0 for v in out["over_replay_paused"].values()
                    for x in v.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
