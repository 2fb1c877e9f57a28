"""tidegate next to vLLM's CPU build on the same checkpoints, measured by vLLM's own client.

For each checkpoint and round, each server is started alone (the order alternates between
rounds), timed to readiness, driven by `vllm bench serve` (through the peers' `bench.sh`: random
prompts, IN_LEN in / OUT_LEN out, --ignore-eos, greedy) at every rate, then stopped. The load
average is recorded before and after each run. The table gives medians over rounds and
tidegate / vLLM ratios; ratios from one run are what to compare on a shared machine.

    python -m bench.serving.compare_vllm --out bench/results/compare_vllm      # tiny-coder + gqa-rope
    python -m bench.serving.compare_vllm --models models/tiny-coder --rounds 1 --rates inf

Needs the vLLM CPU environment made by ../shared/peers/vllm-cpu/setup.sh (`--peers`); writes
`<out>/table.md`, `<out>/runs.json` and vLLM's per-run result files. Leaves no server running.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
METRICS = (("request_throughput", "req/s", True), ("output_throughput", "out tok/s", True),
           ("p50_ttft_ms", "TTFT p50 ms", False), ("p99_ttft_ms", "TTFT p99 ms", False),
           ("p50_tpot_ms", "TPOT p50 ms", False), ("p50_itl_ms", "ITL p50 ms", False),
           ("p50_e2el_ms", "E2E p50 ms", False), ("server_cpu_s", "server CPU s", False))

# Checkpoint shapes of our own (random bf16 weights, the byte-level tokenizer of the tests,
# head_dim 64: vLLM's CPU attention takes 64). gqa-rope: GQA 4:1, linear rope x8 over 8k
# positions; llama-2x256 and llama-3x384: the small LLaMAs of issue 32 (2-3 layers, GQA).
SHAPES = {
    "gqa-rope": {"vocab_size": 512, "hidden_size": 512, "intermediate_size": 1408,
                 "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                 "head_dim": 64, "max_position_embeddings": 8192, "rope_theta": 10000.0,
                 "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                 "tie_word_embeddings": False},
    "llama-2x256": {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 768,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
                    "head_dim": 64, "max_position_embeddings": 2048, "rope_theta": 10000.0,
                    "tie_word_embeddings": True},
    "llama-3x384": {"vocab_size": 1024, "hidden_size": 384, "intermediate_size": 1024,
                    "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
                    "head_dim": 64, "max_position_embeddings": 2048, "rope_theta": 10000.0,
                    "tie_word_embeddings": False},
}
GQA_ROPE = SHAPES["gqa-rope"]


def make_checkpoint(path: Path, shape: dict) -> Path:
    """A random bf16 LLaMA checkpoint of `shape` (LlamaConfig fields) at `path` (kept if there)."""
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(REPO))  # run as a script: the repository's packages
    from tokenizer.byte_level import byte_level_bundle

    torch.manual_seed(0)
    cfg = LlamaConfig(initializer_range=0.05, bos_token_id=256, eos_token_id=257,
                      torch_dtype="bfloat16", **shape)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    bundle = byte_level_bundle()
    (path / "tokenizer.json").write_text(bundle.tokenizer_json)
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": bundle.chat_template,
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    return path


def make_gqa_rope_checkpoint(path: Path) -> Path:
    return make_checkpoint(path, GQA_ROPE)


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes of process group `pgid`: a server's
    cost for a run, less sensitive than its wall time to what else runs on a shared machine."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(f[2]) == pgid:  # fields after the name: state ppid pgrp ... utime stime
                total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    return os.getloadavg()[0]


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what decides bf16 speed on a CPU


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU's model name and which of CPU_FLAGS it has: a ratio against vLLM's CPU build
    depends on it (vLLM runs bf16 natively only with avx512_bf16 / amx_bf16)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith("model name")), "unknown")
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                      if line.startswith("flags")), []))
    return f"{model}; " + " ".join(f if f in flags else f"no-{f}" for f in CPU_FLAGS)


def wait_ready(port: int, proc: subprocess.Popen | None, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server on {port} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server on {port} not ready after {timeout} s")


class Tidegate:
    name = "tidegate"

    def __init__(self, args) -> None:
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self, model: Path, served: str, port: int, log: Path) -> float:
        cmd = [str(REPO / ".venv/bin/tidegate"), "serve", "--model", str(model), "--port", str(port),
               "--served-model-name", served, *self.args.tidegate_args.split()]
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     cwd=REPO, start_new_session=True)
        wait_ready(port, self.proc, 300)
        return time.monotonic() - t0

    def pgid(self, port: int) -> int | None:
        return self.proc.pid if self.proc is not None else None  # start_new_session

    def stop(self, port: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None


class Vllm:
    name = "vllm"

    def __init__(self, args) -> None:
        self.peers = Path(args.peers)
        self.peers_dir = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache/tidegate-peers"))

    def start(self, model: Path, served: str, port: int, log: Path) -> float:
        env = dict(os.environ, SERVED_NAME=served, READY_TIMEOUT=os.environ.get("READY_TIMEOUT", "1800"))
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(self.peers / "serve.sh"), str(port), str(model)], env=env,
                           capture_output=True, text=True, timeout=2000, check=False)
        log.write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"vLLM did not start: {r.stderr[-2000:]}")
        return time.monotonic() - t0

    def pgid(self, port: int) -> int | None:
        pid_file = Path(os.environ.get("LOG_DIR", self.peers_dir / "logs")) / f"vllm-{port}.pid"
        try:
            return int(pid_file.read_text())  # serve.sh starts it with setsid
        except (OSError, ValueError):
            return None

    def stop(self, port: int) -> None:
        subprocess.run(["bash", str(self.peers / "serve.sh"), "stop", str(port)],
                       capture_output=True, timeout=120, check=False)


def bench(args, model: Path, served: str, port: int, label: str, out: Path,
          pgid: int | None = None) -> list[dict]:
    """One `bench.sh` call per rate; a rate may carry its own request count (`1:60`). With the
    server's process group, each run also records the server's CPU seconds over it."""
    runs = []
    for spec in args.rates:
        cpu0 = group_cpu_seconds(pgid) if pgid else None
        rate, _, num = spec.partition(":")
        env = dict(os.environ, MODEL=str(model), SERVED_NAME=served, RESULT_DIR=str(out),
                   NUM_PROMPTS=num or str(args.num_prompts), IN_LEN=str(args.in_len),
                   OUT_LEN=str(args.out_len))
        r = subprocess.run(["bash", str(Path(args.peers) / "bench.sh"), str(port), label, rate],
                           env=env, capture_output=True, text=True, timeout=1800, check=False)
        print(r.stdout, end="", flush=True)
        if r.returncode != 0:
            raise RuntimeError(f"bench failed: {r.stderr[-2000:]}")
        d = json.loads((out / f"{label}_rate{rate}_r1.json").read_text())
        runs.append({"rate": rate, **{k: d.get(k) for k, _, _ in METRICS},
                     "num_prompts": d.get("num_prompts"), "completed": d.get("completed"),
                     "failed": d.get("failed", 0),
                     "server_cpu_s": None if cpu0 is None else group_cpu_seconds(pgid) - cpu0})
    return runs


def table(records: list[dict]) -> str:
    lines = []
    for model in dict.fromkeys(r["model"] for r in records):
        for rate in dict.fromkeys(r["rate"] for r in records):
            lines += [(f"\n**{model}, rate {rate}** (median over rounds; ratio = tidegate / vLLM, "
                       "per round then median)\n"),
                      "| metric | tidegate | vLLM | ratio | better |", "|---|---|---|---|---|"]
            by = {s: [r for r in records if r["model"] == model and r["rate"] == rate
                      and r["server"] == s] for s in ("tidegate", "vllm")}
            for key, label, higher in METRICS:
                t = [r[key] for r in by["tidegate"] if r.get(key) is not None]
                v = [r[key] for r in by["vllm"] if r.get(key) is not None]
                if not t or not v:
                    continue
                ratios = [a / b for a, b in zip(t, v) if b]  # pairs in run order
                ratio = statistics.median(ratios) if ratios else float("nan")
                better = "tidegate" if (ratio > 1) == higher else "vLLM"
                lines.append(f"| {label} | {statistics.median(t):.2f} | {statistics.median(v):.2f} "
                             f"| {ratio:.2f} | {better} |")
    ready = {}
    for r in records:
        ready.setdefault((r["model"], r["server"]), set()).add(round(r["ready_s"], 1))
    lines += ["\n| ready after start (s) | tidegate | vLLM |", "|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in records):
        lines.append(f"| {model} | {sorted(ready.get((model, 'tidegate'), []))} "
                     f"| {sorted(ready.get((model, 'vllm'), []))} |")
    loads = [(r["load_before"], r["load_after"]) for r in records]
    lines.append("\nLoad average (1 min) before/after each run: "
                 + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in dict.fromkeys(loads)))
    cpus = dict.fromkeys(r.get("cpu", "not recorded") for r in records)
    lines.append("\nCPU: " + " | ".join(cpus))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="models/tiny-coder,gqa-rope",
                   help="checkpoint dirs, or shape names made here under --out: "
                        + ", ".join(SHAPES))
    p.add_argument("--quiet-file", default=None,
                   help="a file to create for each server's runs and remove after (a shared "
                        "machine's signal to pause other work)")
    p.add_argument("--quiet-wait", type=float, default=20.0,
                   help="seconds after creating --quiet-file before the server starts (others "
                        "finish the command they are in; a test run can take a minute)")
    p.add_argument("--rates", nargs="+", default=["inf", "20"],
                   help="request rates; RATE:N runs N requests at that rate (default --num-prompts)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--in-len", type=int, default=128)
    p.add_argument("--out-len", type=int, default=32)
    p.add_argument("--port", type=int, default=18123)
    p.add_argument("--peers", default=str(REPO.parent / "shared/peers/vllm-cpu"))
    p.add_argument("--tidegate-args", default="", help="extra `tidegate serve` flags")
    p.add_argument("--servers", default="tidegate,vllm")
    p.add_argument("--out", default="bench/results/compare_vllm")
    p.add_argument("--table-from", nargs="+", default=None, metavar="RUNS_JSON",
                   help="no runs: write the table of earlier runs.json files (rounds pooled)")
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if a.table_from:
        records = [r for f in a.table_from for r in json.loads(Path(f).read_text())]
        text = table(records)
        (out / "table.md").write_text(text)
        print(text)
        return 0
    servers = {"tidegate": Tidegate(a), "vllm": Vllm(a)}
    order = [servers[s] for s in a.servers.split(",")]
    records = []
    for spec in a.models.split(","):
        model = make_checkpoint(out / spec, SHAPES[spec]) if spec in SHAPES else Path(spec).resolve()
        served = model.name
        for rnd in range(a.rounds):
            for srv in (order if rnd % 2 == 0 else order[::-1]):
                label = f"{served}_{srv.name}_round{rnd}"
                quiet = Path(a.quiet_file) if a.quiet_file else None
                if quiet is not None:
                    quiet.touch()
                    time.sleep(a.quiet_wait)  # others finish the command they are in
                before = load_average()
                try:
                    ready = srv.start(model, served, a.port, out / f"{label}.server.log")
                    print(f"{label}: ready after {ready:.1f} s (load {before:.1f})", flush=True)
                    runs = bench(a, model, served, a.port, label, out, srv.pgid(a.port))
                finally:
                    srv.stop(a.port)
                    if quiet is not None:
                        quiet.unlink(missing_ok=True)
                after = load_average()
                records += [{"model": served, "server": srv.name, "round": rnd, "ready_s": ready,
                             "load_before": before, "load_after": after,
                             "cpu": cpu_description(), **r} for r in runs]
                (out / "runs.json").write_text(json.dumps(records, indent=1))
    text = table(records)
    (out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
