"""`tidegate eval`: model quality (and decode speed) through our own engine.

    tidegate eval perplexity --model models/tiny-coder [--device cuda] [--quantization fp8]
    tidegate eval perplexity --model tiny --max-files 3          # random preset, byte tokenizer
    tidegate eval agreement --model models/tiny-coder --a dtype=float32 --b dtype=bfloat16
    tidegate eval speed                                          # CPU decode tok/s, embedded default

**perplexity**: token-level perplexity of the held-out standard-library files
(`evals.data`: tiny-coder's `heldout_files.txt`, looked up under this interpreter's
stdlib) with the training script's protocol: per file `<bos> text <eos>`, windows of
`--chunk-len` predicted tokens with the context restarting at each window, every token after
`<bos>` predicted once; ppl = exp(mean NLL). A preset is scored on the same text tokenized with
its own tokenizer (the byte-level one for `tiny`: random weights give about its vocabulary
size, 259). The windows run through the engine (`evals.engine.score_all_rows`): the
scheduler admits them and cuts them into prefill chunks under `--max-num-batched-tokens`
(a window that does not fit what is left of a step continues next step, reading its first
part back from the paged KV cache), the runner and model compute them as a served prefill,
and the LM head is applied to every row. Progress goes to stderr; the result line to stdout.

**agreement**: greedy-decode agreement between two engine settings (`--a`, `--b`: comma
lists of key=value over dtype, kv-cache-dtype, quantization, device; unset keys take the
shared `--dtype/--kv-cache-dtype/--quantization/--device`). Definition: N prompts of
`--prompt-len` held-out tokens (`eval_data.agreement_prompts` over the first N held-out files
found: prompt i from file i mod F, at 1/2 of it, then 1/4, 3/4, ... in later rounds); engine A continues each
greedily for M = `--max-tokens` tokens (eos ignored), giving a[i][0..M). Engine B is
teacher-forced on A's tokens: at position t it is fed prompt + a[i][:t] through the same
prefill/decode steps and its greedy choice b[i][t] is recorded. agreement = share of the N*M
positions with b == a; one divergence does not cascade. Also reported: agreement of the first
token (from the prefill alone) and the share of continuations that agree at every position.
With identical settings it is exactly 1.0 (same batches, same kernels, deterministic).

**speed**: single-stream (or `--batch B`) greedy decode throughput of an engine built exactly
as `tidegate backend` builds it (same option defaults; the model defaults to the embedded
default's, models/tiny-coder when present). decode tok/s = generated tokens after the first /
time after the first step (the first step is the prefill, reported as its own time).

Unsupported settings (a kv-cache dtype or quantization this engine does not have) fail with a
one-line error listing the supported values, exit code 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

from backend.errors import ModelLoadError
from backend.model.loader import read_config
from evals.data import (
    agreement_prompts,
    default_heldout_list,
    encode_docs,
    load_heldout,
    make_windows,
    spaced_indices,
    truncate_windows,
)
from evals.engine import (
    EngineSettings,
    EngineShape,
    EvalError,
    build_engine,
    check_settings,
    greedy_decode,
    load_error_message,
    parse_settings,
    score_all_rows,
    serving_options,
    synchronize,
)


class Progress:
    """Rate-limited one-line progress on stderr."""

    def __init__(self, label: str, enabled: bool = True, every_s: float = 2.0) -> None:
        self.label, self.enabled, self.every_s = label, enabled, every_s
        self.t0 = time.perf_counter()
        self.last = 0.0

    def __call__(self, msg: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if force or now - self.last >= self.every_s:
            self.last = now
            print(f"[{self.label} {now - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---- perplexity ---------------------------------------------------------------------------------

def perplexity(model: str, settings: EngineSettings, shape: EngineShape | None = None, *,
               window: int = 512, max_files: int | None = None, max_tokens: int | None = None,
               sample_windows: int | None = None, heldout_list: str | Path | None = None,
               stdlib_root: str | Path | None = None, site_root: str | Path | None = None,
               progress: bool = True) -> dict:
    """Held-out perplexity through the engine (see the module docstring). Returns a report dict:
    ppl, nll, tokens, files, files_listed, files_skipped, windows, chunked_windows, seconds, ...

    Subsets, applied in this order: `max_files` (the first N listed files found),
    `sample_windows` (N windows evenly spaced over all windows of those files, window
    `floor((k + 1/2) * W / N)` for k < N: a quick estimate that spans the whole set),
    `max_tokens` (the first N predicted tokens, the last window cut short)."""
    import torch

    shape = shape or EngineShape()
    for name, v in (("--chunk-len", window), ("--max-files", max_files),
                    ("--max-tokens", max_tokens), ("--sample-windows", sample_windows)):
        if v is not None and v < 1:
            raise EvalError(f"{name} must be >= 1, got {v}")
    heldout = load_heldout(heldout_list or default_heldout_list(model), stdlib_root, max_files,
                           site_root=site_root)
    if not heldout.files:
        raise EvalError(f"no held-out file found: {heldout.describe()}")
    config, _ = read_config(model)
    if window + 1 > config.max_position_embeddings:
        raise EvalError(f"--chunk-len {window} needs {window + 1} positions, the model has "
                        f"{config.max_position_embeddings}")
    t_load = time.perf_counter()
    engine, loaded = build_engine(model, settings,
                                  dataclasses.replace(shape, max_model_len=window + 1))
    load_s = time.perf_counter() - t_load
    tok = loaded.tokenizer
    docs = encode_docs(tok, [text for _, text in heldout.files])
    windows = [(fi, wi, x, y) for fi, doc in enumerate(docs)
               for wi, (x, y) in enumerate(make_windows(doc, window))]
    if sample_windows is not None and sample_windows < len(windows):
        windows = [windows[w] for w in spaced_indices(len(windows), sample_windows)]
    kept = truncate_windows([(x, y) for _, _, x, y in windows], max_tokens)
    requests, targets, file_of = [], {}, {}
    for (fi, wi, _, _), (x, y) in zip(windows, kept):
        rid = f"f{fi}w{wi}"
        requests.append((rid, x))
        targets[rid] = torch.tensor(y, dtype=torch.long, device=loaded.device)
        file_of[rid] = fi
    files_used = sorted({file_of[r] for r, _ in requests})
    total = sum(len(t) for t in targets.values())
    nll_file = [0.0] * len(heldout.files)
    n_file = [0] * len(heldout.files)
    acc = {"nll": 0.0, "n": 0}
    prog = Progress("perplexity", progress)
    prog(f"{model}: {heldout.describe()}; {len(requests)} windows of <= {window} tokens, "
         f"{total:,} tokens to predict ({settings.label()}, {loaded.device}, "
         f"{str(loaded.dtype).removeprefix('torch.')})", force=True)

    def on_rows(rid: str, start: int, logits: torch.Tensor) -> None:
        y = targets[rid][start:start + logits.shape[0]]
        nll = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
        v = float(nll)
        acc["nll"] += v
        acc["n"] += int(y.numel())
        f = file_of[rid]
        nll_file[f] += v
        n_file[f] += int(y.numel())

    def on_step() -> None:
        n = acc["n"]
        if n:
            el = time.perf_counter() - t0
            prog(f"{n:,}/{total:,} tokens ({100 * n / total:.0f}%), ppl so far "
                 f"{math.exp(acc['nll'] / n):.4f}, {n / el:,.0f} tok/s")

    t0 = time.perf_counter()
    chunks = score_all_rows(engine, requests, on_rows,
                            next_token=lambda rid: int(targets[rid][-1]), on_step=on_step)
    synchronize(engine)
    seconds = time.perf_counter() - t0
    n = acc["n"]
    assert n == total, (n, total)
    nll = acc["nll"] / n
    report = {
        "model": model, "settings": settings.as_dict(),
        "dtype": str(loaded.dtype).removeprefix("torch."), "device": str(loaded.device),
        "ppl": math.exp(nll), "nll": nll, "tokens": n, "files": len(files_used),
        "files_listed": heldout.listed,
        "files_skipped": len(heldout.missing) + len(heldout.unreadable),
        "stdlib_root": str(heldout.root), "window": window,
        "max_num_batched_tokens": shape.max_num_batched_tokens,
        "windows": len(requests), "chunked_windows": sum(1 for c in chunks.values() if c > 1),
        "seconds": seconds, "tokens_per_s": n / seconds, "load_seconds": load_s,
        "sample_windows": sample_windows,
        "per_file": [{"path": heldout.files[i][0], "tokens": n_file[i],
                      "ppl": math.exp(nll_file[i] / n_file[i])} for i in files_used],
    }
    prog(f"done: ppl {report['ppl']:.4f} over {n:,} tokens in {seconds:.1f} s", force=True)
    return report


# ---- agreement ----------------------------------------------------------------------------------

def _release_memory(device) -> None:
    """After the caller dropped its engine: collect it and return cached CUDA memory."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def agreement(model: str, a: EngineSettings, b: EngineSettings, shape: EngineShape | None = None,
              *, num_prompts: int = 32, prompt_len: int = 64, max_tokens: int = 32,
              heldout_list: str | Path | None = None, stdlib_root: str | Path | None = None,
              prompts: list[list[int]] | None = None, site_root: str | Path | None = None,
              progress: bool = True) -> dict:
    """Greedy agreement of settings B with A, teacher-forced on A (see the module docstring).
    `prompts` (token ids) replaces the held-out prompts when given."""
    shape = shape or EngineShape()
    if num_prompts < 1 or max_tokens < 1 or prompt_len < 1:
        raise EvalError("--num-prompts, --max-tokens and --prompt-len must be >= 1")
    check_settings(a)
    check_settings(b)  # before A runs
    prog = Progress("agreement", progress)
    t0 = time.perf_counter()
    engine, loaded = build_engine(model, a, shape)
    if prompts is None:
        # the first num_prompts files found are enough: prompt i comes from file i mod F
        heldout = load_heldout(heldout_list or default_heldout_list(model), stdlib_root,
                               max_files=num_prompts, site_root=site_root)
        docs = encode_docs(loaded.tokenizer, [text for _, text in heldout.files])
        try:
            prompts = agreement_prompts(docs, num_prompts, prompt_len,
                                        loaded.tokenizer.bos_token_id)
        except ValueError as exc:
            raise EvalError(f"{exc} ({heldout.describe()})") from None
        source = heldout.describe()
    else:
        source = f"{len(prompts)} given prompts"
    prog(f"{model}: {len(prompts)} prompts ({source}), {max_tokens} tokens each; "
         f"A = {a.label()}", force=True)
    a_tokens = greedy_decode(engine, prompts, max_tokens,
                             on_step=lambda d, t: prog(f"A: {d:,}/{t:,} tokens"))
    synchronize(engine)
    a_s = time.perf_counter() - t0
    device = engine.runner.device
    del engine, loaded
    _release_memory(device)
    prog(f"B = {b.label()} (teacher-forced on A)", force=True)
    t1 = time.perf_counter()
    engine, _ = build_engine(model, b, shape)
    b_pred = greedy_decode(engine, prompts, max_tokens, forced=a_tokens,
                           on_step=lambda d, t: prog(f"B: {d:,}/{t:,} tokens"))
    synchronize(engine)
    b_s = time.perf_counter() - t1
    device = engine.runner.device
    del engine
    _release_memory(device)
    same = [[int(x == y) for x, y in zip(ra, rb)] for ra, rb in zip(a_tokens, b_pred)]
    total = sum(len(r) for r in same)
    first_div = [r.index(0) if 0 in r else None for r in same]
    report = {
        "model": model, "a": a.as_dict(), "b": b.as_dict(),
        "num_prompts": len(prompts), "prompt_len": prompt_len, "max_tokens": max_tokens,
        "agreement": sum(map(sum, same)) / total, "positions": total,
        "first_token_agreement": sum(r[0] for r in same) / len(same),
        "exact_continuations": sum(1 for r in same if all(r)) / len(same),
        "mean_first_divergence": statistics.fmean(
            d if d is not None else max_tokens for d in first_div),
        "seconds_a": a_s, "seconds_b": b_s,  # engine build and prompts included
    }
    prog(f"done: agreement {report['agreement']:.4f} over {total:,} positions", force=True)
    return report


# ---- speed --------------------------------------------------------------------------------------

SPEED_PROMPT = "def fibonacci(n):\n"


def decode_speed(argv_engine: list[str], *, max_tokens: int = 128, batch: int = 1,
                 repeats: int = 3, prompt: str = SPEED_PROMPT, quantization: str = "none",
                 progress: bool = True) -> dict:
    """Greedy decode throughput of an engine built from `tidegate backend` options."""
    import torch

    from backend.engine.args import add_engine_args, backend_config
    from backend.engine.assemble import create_engine
    from backend.runner.sampler import SamplingParams

    p = argparse.ArgumentParser(prog="tidegate eval speed", add_help=False)
    add_engine_args(p)
    args = p.parse_args(argv_engine)
    cfg = backend_config(args)
    check_settings(EngineSettings(dtype=cfg.dtype, quantization=quantization, device=cfg.device))
    try:
        engine, loaded = create_engine(cfg, serving_options(quantization))
    except ModelLoadError as exc:  # e.g. a quantization this device cannot run
        raise EvalError(f"quantization {quantization!r}: {exc}") from None
    ids = loaded.tokenizer.encode(prompt)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    prog = Progress("speed", progress)
    runs = []
    for r in range(repeats + 1):  # run 0 warms up
        for j in range(batch):
            refusal = engine.add_request(f"r{r}b{j}", ids, params)
            if refusal:
                raise EvalError(refusal)
        t0 = time.perf_counter()
        engine.step()
        synchronize(engine)
        t1 = time.perf_counter()
        steps = 1
        while engine.has_unfinished():
            engine.step()
            steps += 1
        synchronize(engine)
        t2 = time.perf_counter()
        if r:
            runs.append({"prefill_s": t1 - t0, "decode_s": t2 - t1,
                         "decode_tok_s": batch * (max_tokens - 1) / (t2 - t1)})
            prog(f"run {r}: {runs[-1]['decode_tok_s']:.1f} decode tok/s", force=True)
    return {
        "model": cfg.model, "device": str(loaded.device), "quantization": quantization,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "cpu_threads": torch.get_num_threads() if loaded.device.type == "cpu" else None,
        "batch": batch, "prompt_tokens": len(ids), "max_tokens": max_tokens, "repeats": repeats,
        "decode_tok_s": statistics.median(x["decode_tok_s"] for x in runs),
        "prefill_s": statistics.median(x["prefill_s"] for x in runs),
        "runs": runs,
    }


# ---- CLI ----------------------------------------------------------------------------------------

def _add_shape_args(p: argparse.ArgumentParser, default_budget: int) -> None:
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy", "safetensors"])
    p.add_argument("--seed", type=int, default=0, help="seed of random (preset) weights")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--max-num-batched-tokens", type=int, default=default_budget,
                   help="engine tokens per step; longer prefills are chunked across steps")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads on the CPU (default: the engine's, half the cores)")


def _add_setting_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto",
                   help="auto|float32|bfloat16|float16 (auto: float32 on the CPU, the "
                        "checkpoint's dtype on CUDA)")
    p.add_argument("--kv-cache-dtype", default="auto", help="KV cache dtype (auto: the model dtype)")
    p.add_argument("--quantization", default="none", help="weight quantization: none|fp8")
    p.add_argument("--device", default="cpu", help="cpu | cuda[:N]")


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heldout-list", default=None,
                   help="held-out paths (default: the model's heldout_files.txt, else "
                        "models/tiny-coder's)")
    p.add_argument("--stdlib-root", default=None,
                   help="where the listed paths are looked up (default: this interpreter's "
                        "stdlib, sysconfig.get_paths()['stdlib'])")
    p.add_argument("--site-root", default=None,
                   help="where 'site-packages/...' held-out paths are looked up (default: this "
                        "environment's site-packages)")


def _shape(args) -> EngineShape:
    return EngineShape(load_format=args.load_format, seed=args.seed, block_size=args.block_size,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       max_num_seqs=args.max_num_seqs, cpu_threads=args.cpu_threads)


def _settings(args) -> EngineSettings:
    return EngineSettings(dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
                          quantization=args.quantization, device=args.device)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate eval", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True,
                           metavar="{perplexity,agreement,speed,code}")

    pp = sub.add_parser("perplexity", help="held-out perplexity through the engine",
                        description="Token-level perplexity of the held-out stdlib files "
                                    "through our engine (see `evals/cli.py`).")
    pp.add_argument("--model", required=True, help="HF model directory or preset name")
    _add_setting_args(pp)
    _add_data_args(pp)
    pp.add_argument("--max-files", type=int, default=None, help="first N held-out files found")
    pp.add_argument("--max-tokens", type=int, default=None, help="stop after N predicted tokens")
    pp.add_argument("--sample-windows", type=int, default=None,
                    help="score only N windows evenly spaced over the held-out set (quick)")
    pp.add_argument("--chunk-len", type=int, default=512,
                    help="predicted tokens per window; the context restarts at each window "
                         "(512 = the training script's protocol)")
    _add_shape_args(pp, 2048)
    pp.add_argument("--json", default=None, metavar="OUT", help="write the report here")
    pp.add_argument("--quiet", action="store_true", help="no progress on stderr")

    pa = sub.add_parser("agreement", help="greedy agreement between two engine settings",
                        description="Greedy-decode agreement of settings B with A, teacher-forced "
                                    "on A's tokens (see `evals/cli.py`).")
    pa.add_argument("--model", required=True, help="HF model directory or preset name")
    pa.add_argument("--a", default="", help="settings A: key=value,... over dtype, "
                    "kv-cache-dtype, quantization, device (e.g. 'dtype=float32')")
    pa.add_argument("--b", default="", help="settings B, same syntax (e.g. 'dtype=bfloat16')")
    _add_setting_args(pa)
    _add_data_args(pa)
    pa.add_argument("--num-prompts", type=int, default=32)
    pa.add_argument("--prompt-len", type=int, default=64, help="held-out tokens per prompt")
    pa.add_argument("--max-tokens", type=int, default=32, help="continuation length M")
    _add_shape_args(pa, 2048)
    pa.add_argument("--json", default=None, metavar="OUT")
    pa.add_argument("--quiet", action="store_true")

    pc = sub.add_parser("code", help="bits per byte vs gzip/xz, FIM exact-line match, header "
                        "completions that parse (see `evals/code.py`)",
                        description="What a code model has learned, through our engine, on its "
                                    "held-out packages (see `evals/code.py`).")
    pc.add_argument("--model", required=True, help="HF model directory")
    _add_setting_args(pc)
    _add_data_args(pc)
    pc.add_argument("--files-sample", type=int, default=None,
                    help="bits per byte on N held-out files evenly spaced over the list (quick)")
    pc.add_argument("--chunk-len", type=int, default=1024,
                    help="predicted tokens per window (the training script's --seq-len)")
    pc.add_argument("--fim-cases", type=int, default=64)
    pc.add_argument("--fim-max-tokens", type=int, default=32)
    pc.add_argument("--heldout-headers", type=int, default=8,
                    help="also complete the signature lines of N held-out functions (0: none)")
    pc.add_argument("--parts", default="bpb,fim,headers", help="comma list of bpb, fim, headers")
    pc.add_argument("--generation-config", default="none", metavar="none|auto|DIR",
                    help="decode the FIM and header completions as the server would with "
                         "`--generation-config` (auto: the model's generation_config.json; its "
                         "temperature, top_p/top_k/min_p and penalties, seed 0; the token "
                         "budgets stay the evaluation's); none (default): greedy")
    _add_shape_args(pc, 2048)
    pc.add_argument("--json", default=None, metavar="OUT")
    pc.add_argument("--quiet", action="store_true")

    ps = sub.add_parser("speed", help="greedy decode tokens/s of a backend configuration",
                        description="Decode throughput of an engine built like `tidegate "
                                    "backend`: every `tidegate backend` engine option is "
                                    "accepted with its default (--model, --device, --dtype, "
                                    "--cpu-threads, ...); --model defaults to the embedded "
                                    "default's model.")
    ps.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request")
    ps.add_argument("--batch", type=int, default=1, help="concurrent requests")
    ps.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    ps.add_argument("--prompt", default=SPEED_PROMPT)
    ps.add_argument("--quantization", default="none", help="weight quantization: none|fp8")
    ps.add_argument("--json", default=None, metavar="OUT")
    ps.add_argument("--quiet", action="store_true")
    return p


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's doing: one line on stderr, exit code 2."""
    errors: tuple[type[BaseException], ...] = (EvalError, ModelLoadError, FileNotFoundError)
    try:
        from backend.model.quantization import QuantizationError
    except ImportError:
        return errors
    return (*errors, QuantizationError)


def _write_json(path: str | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "speed":  # the engine options are `tidegate backend`'s own
        args, engine_argv = parser.parse_known_args(argv)
    else:
        args, engine_argv = parser.parse_args(argv), []
    try:
        if args.cmd == "perplexity":
            r = perplexity(args.model, _settings(args), _shape(args), window=args.chunk_len,
                           max_files=args.max_files, max_tokens=args.max_tokens,
                           sample_windows=args.sample_windows, heldout_list=args.heldout_list,
                           stdlib_root=args.stdlib_root, site_root=args.site_root,
                           progress=not args.quiet)
            print(f"ppl {r['ppl']:.4f}  tokens {r['tokens']}  files {r['files']}"
                  f"{' (' + str(r['files_skipped']) + ' listed files not found)' if r['files_skipped'] else ''}"
                  f"  seconds {r['seconds']:.1f}")
        elif args.cmd == "code":
            from evals import code as eval_code

            r = eval_code.run(args.model, _settings(args), _shape(args), window=args.chunk_len,
                              files_sample=args.files_sample, fim_n=args.fim_cases,
                              fim_max_tokens=args.fim_max_tokens,
                              heldout_list=args.heldout_list, site_root=args.site_root,
                              stdlib_root=args.stdlib_root,
                              heldout_header_n=args.heldout_headers,
                              parts=tuple(x for x in args.parts.split(",") if x),
                              generation_config=args.generation_config,
                              progress=not args.quiet)
            line = []
            if "bpb" in r:
                b = r["bpb"]
                line.append(f"bits/byte {b['bits_per_byte']:.4f} (gzip -9 "
                            f"{b['gzip9_bits_per_byte']:.4f}, xz -9 {b['xz9_bits_per_byte']:.4f}; "
                            f"{b['files']} files, {b['tokens']} tokens)")
            if "fim" in r:
                f = r["fim"]
                line.append(f"fim exact line {f['exact']}/{f['total']} (ignoring whitespace "
                            f"{f['exact_ignoring_whitespace']}, line similarity "
                            f"{f['mean_line_similarity']:.3f}, token accuracy "
                            f"{f['token_accuracy']:.3f})")
            for key, name in (("headers", "headers"), ("heldout_headers", "held-out headers")):
                if key in r:
                    h = r[key]
                    line.append(f"{name} parse {h['parsed']}/{h['total']} (finished within "
                                f"the budget {h['parsed_and_finished']}; old protocol "
                                f"{h['parsed_old_protocol']}/{h['total']})")
            print("  ".join(line))
        elif args.cmd == "agreement":
            base = _settings(args)
            a, b = parse_settings(args.a, base), parse_settings(args.b, base)
            r = agreement(args.model, a, b, _shape(args), num_prompts=args.num_prompts,
                          prompt_len=args.prompt_len, max_tokens=args.max_tokens,
                          heldout_list=args.heldout_list, stdlib_root=args.stdlib_root,
                          site_root=args.site_root, progress=not args.quiet)
            print(f"agreement {r['agreement']:.4f}  positions {r['positions']}  "
                  f"first_token {r['first_token_agreement']:.4f}  "
                  f"exact_continuations {r['exact_continuations']:.4f}  "
                  f"A [{a.label()}]  B [{b.label()}]")
        else:
            if "--model" not in engine_argv and not any(x.startswith("--model=") for x in engine_argv):
                from backend.engine.args import default_model

                engine_argv = ["--model", default_model(), *engine_argv]
            r = decode_speed(engine_argv, max_tokens=args.max_tokens, batch=args.batch,
                             repeats=args.repeats, prompt=args.prompt,
                             quantization=args.quantization, progress=not args.quiet)
            print(f"decode {r['decode_tok_s']:.1f} tok/s  (batch {r['batch']}, {r['max_tokens']} "
                  f"tokens, {r['device']} {r['dtype']}, {r['cpu_threads']} threads; prefill "
                  f"{r['prefill_s'] * 1e3:.1f} ms)  model {r['model']}")
    except user_errors() as exc:
        print(f"tidegate eval: error: {load_error_message(exc)}", file=sys.stderr)
        return 2
    _write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
