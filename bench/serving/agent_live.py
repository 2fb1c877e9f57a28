"""Issue 30's live goal on this machine: an agent-session trace through a gateway in front of N
CPU backends, and the same trace through the simulator with the same placement.

    python -m bench.serving.agent_live --json bench/results/agent_sessions/live_cpu.json

Writes the scaled-down trace (`sims.agent_trace`, 2K context: tiny-coder's), starts `--backends`
`tidegate backend --model MODEL --num-blocks N` processes (ipc sockets) and `tidegate serve
--placement prefix` in front of them, runs `tidegate bench serve --agent-trace` (with session
headers, then, with `--both-keys`, without), then `tidegate sim agent --agent-trace` on the same
file with `--profile` (a `tidegate backend profile` of this machine) and the same KV blocks and
capacity factor 1 (the trace's own times). Reports both, and the live/simulated reuse ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.serving.placement_live import free_port, per_engine_up, stop, wait_http
from sims import agent_trace as at

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def scaled_trace_config(a: argparse.Namespace) -> at.AgentTraceConfig:
    """The published shape at tiny-coder's 2K context (sims.agent_trace: outputs and the
    per-turn growth scaled with the context, so a session still runs ~10 turns)."""
    return at.AgentTraceConfig(
        num_sessions=a.sessions, session_rate=a.session_rate, max_context=a.max_context,
        system_prompt_tokens=600, first_message_tokens=180, first_message_sigma=0.5,
        output_tokens=40, output_sigma=0.6, max_output_tokens=128, new_tokens=12,
        new_sigma=0.8, tool_latency_s=a.tool_latency_s, max_turns=12, subagent_prob=0.08,
        subagent_turns=(2, 4), subagent_task_tokens=40, pin_fraction=a.pin_fraction,
        pin_ttl_s=a.pin_ttl_s, nominal_tpot_s=0.02, nominal_prefill_s=0.3, seed=a.seed)


def live(a: argparse.Namespace, trace_file: Path, tmp: str, keys: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [PY, "-m", "gateway.tidegate_cli"]
    procs: list[subprocess.Popen] = []
    addrs = []
    log = Path(a.log_dir or tmp) / f"live_{'keys' if keys else 'nokeys'}.log"
    with open(log, "w") as logs:
        try:
            for i in range(a.backends):
                addr = f"ipc://{tmp}/b{i}_{int(keys)}.sock"
                procs.append(subprocess.Popen(
                    cli + ["backend", "--listen", addr, "--model", a.model,
                           "--num-blocks", str(a.num_blocks), "--cpu-threads", "1",
                           "--pin-budget-fraction", str(a.pin_budget_fraction)],
                    env=env, stdout=logs, stderr=subprocess.STDOUT))
                addrs.append(addr)
            port = free_port()
            # a shared 2-core machine: a step may stall for seconds; not a dead backend
            serve = cli + ["serve", "--port", str(port), "--placement", "prefix",
                           "--tokenizer", a.model, "--heartbeat-timeout", "120"]
            for addr in addrs:
                serve += ["--backend", addr]
            procs.append(subprocess.Popen(serve, env=env, stdout=logs, stderr=subprocess.STDOUT))
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/v1/models", 600)
            t_end = time.monotonic() + 600
            while len(per_engine_up(url)) < len(addrs) and time.monotonic() < t_end:
                time.sleep(1)
            out_json = Path(tmp) / f"bench_{int(keys)}.json"
            cmd = cli + ["bench", "serve", "--url", url, "--agent-trace", str(trace_file),
                         "--token-id-range", f"3:{a.vocab}", "--json", str(out_json)]
            if not keys:
                cmd.append("--no-session-keys")
            subprocess.run(cmd, env=env, check=False, stdout=logs, stderr=subprocess.STDOUT)
            return json.loads(out_json.read_text())
        finally:
            stop(procs[::-1])


def simulate(a: argparse.Namespace, trace_file: Path, tmp: str) -> dict:
    out_json = Path(tmp) / "sim.json"
    cmd = [PY, "-m", "sims", "agent", "--agent-trace", str(trace_file), "--backends",
           str(a.backends), "--num-blocks", str(a.num_blocks), "--max-model-len",
           str(a.max_context), "--capacity-factor", "1", "--loads", "1",
           "--policies", "prefix", "--json", str(out_json)]
    cmd += ["--profile", a.profile] if a.profile else ["--step-ms", str(a.step_ms)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                   stdout=subprocess.DEVNULL)
    return json.loads(out_json.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.agent_live", description=__doc__)
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--model", default=str(ROOT / "models" / "tiny-coder"))
    p.add_argument("--vocab", type=int, default=8192, help="token ids are drawn from [3, VOCAB)")
    p.add_argument("--num-blocks", type=int, default=500, help="KV blocks per backend")
    p.add_argument("--pin-budget-fraction", type=float, default=0.5)
    p.add_argument("--profile", default=str(ROOT / "docs/window_defaults/cpu_tiny_coder_profile.json"))
    p.add_argument("--step-ms", type=float, default=20.0, help="without --profile")
    p.add_argument("--sessions", type=int, default=10)
    p.add_argument("--session-rate", type=float, default=0.15)
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--pin-fraction", type=float, default=0.3)
    p.add_argument("--tool-latency-s", type=float, default=1.0,
                   help="median tool time between turns (longer: follow-ups after their turn)")
    p.add_argument("--pin-ttl-s", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--both-keys", action="store_true", help="also run without session headers")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tg-agent-") as tmp:
        trace = at.generate(scaled_trace_config(a))
        trace_file = Path(a.log_dir or tmp) / "agent_trace_cpu.jsonl"
        at.write(trace, trace_file)
        figures = at.trace_figures(trace)
        print(f"trace: {json.dumps({k: v for k, v in figures.items() if k != 'published'})}")
        runs = {"keys": live(a, trace_file, tmp, True)}
        if a.both_keys:
            runs["no_keys"] = live(a, trace_file, tmp, False)
        sim = simulate(a, trace_file, tmp)
        sim_runs = {("keys" if r["session_keys"] else "no_keys"): r for r in sim["runs"]}
        out = {"trace": figures, "live": runs, "sim": sim_runs,
               "machine": {"cpus": os.cpu_count(), "backends": a.backends,
                           "num_blocks": a.num_blocks, "model": a.model}, "argv": argv}
        for k, r in runs.items():
            s = sim_runs.get(k)
            if s is not None and s["reuse_captured"]:
                r["reuse_vs_sim"] = r["reuse_captured"] / s["reuse_captured"]
            print(f"{k}: live reuse {r['reuse_captured']:.3f} (sim "
                  f"{s['reuse_captured'] if s else float('nan'):.3f}), follow-up TTFT p50 "
                  f"{r['ttft_p50_ms_followup']:.0f} ms (sim "
                  f"{s['ttft_p50_ms_followup'] if s else float('nan'):.0f}), moves "
                  f"{r['session_moves']:.0f}, pins {r['pins']}")
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
