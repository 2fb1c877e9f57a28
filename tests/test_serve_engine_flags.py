"""`tidegate serve` takes every engine flag of `tidegate backend` and hands it to its embedded
backend: the flag parses in `serve`, comes out in the backend's argv, and lands in the backend's
parsed options and `BackendConfig`. End to end, a served tiny model obeys the flags it was given."""
from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from backend.engine.args import backend_config
from backend.server.cli import serve_parser as backend_parser
from gateway.serve import build_parser as serve_parser
from gateway.serve import embedded_backend_argv

ROOT = Path(__file__).parents[1]
# flags of `tidegate backend` about its process and socket, not its engine: serve sets them itself
NOT_ENGINE = {"-h", "--help", "--listen", "--backend-id", "--served-model-name", "--role",
              "--kv-pull-timeout", "--no-kv-pull-checksum",
              # pulls between backends (issue 34): a KV socket and its thread; serve's one
              # embedded backend has no peer
              "--kv-listen", "--kv-pull-serve", "--kv-pull-land-wait", "--kv-pull-transport",
              "--curve-key", "--curve-allow", "--insecure"}  # security: an ipc:// socket needs none
# tensor parallelism over several hosts places this process among others (a LeaderWorkerSet's
# pods); the embedded backend of `tidegate serve` is one process on one host
NOT_ENGINE |= {"--tp-nodes", "--tp-node-rank", "--tp-rendezvous"}


def _engine_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not set(a.option_strings) & NOT_ENGINE]


def _sample_value(action: argparse.Action) -> tuple[list[str], object]:
    """argv for one flag with a value other than the backend's default, and the parsed value."""
    if action.nargs == 0:
        return [action.option_strings[0]], True
    if action.choices:
        value = next(c for c in action.choices if c != action.default)
        return [action.option_strings[0], value], value
    if action.type is int:
        value = (action.default or 0) + 3
    elif action.type is float:
        value = 0.37
    elif action.dest == "cuda_graph_buckets":
        value = "1,3,5"
    elif action.dest == "model":
        value = "deepseek-coder-1.3b"
    elif action.dest == "speculation_sources":
        value = "prompt"
    else:
        value = f"/tmp/x-{action.dest}"
    return [action.option_strings[0], str(value)], value


def test_every_backend_engine_flag_is_a_serve_flag():
    serve_flags = {s for a in serve_parser()._actions for s in a.option_strings}
    engine_flags = {s for a in _engine_actions(backend_parser()) for s in a.option_strings}
    assert len(engine_flags) >= 18  # the list is not accidentally empty
    assert engine_flags - serve_flags == set()
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--quantization", "--kv-cache-dtype",
                 "--enforce-eager", "--cuda-graph-buckets", "--device", "--load-format", "--dtype"):
        assert flag in engine_flags


@pytest.mark.parametrize("action", _engine_actions(backend_parser()), ids=lambda a: a.dest)
def test_each_flag_reaches_the_backend_options_and_config(action):
    argv, value = _sample_value(action)
    args = serve_parser().parse_args(argv)
    backend_argv = embedded_backend_argv(args, "ipc:///tmp/x.sock")
    assert backend_argv[:3] == ["backend", "--listen", "ipc:///tmp/x.sock"]
    ns = backend_parser().parse_args(backend_argv[1:])
    assert getattr(ns, action.dest) == value
    # nothing else moved off the backend's own defaults
    defaults = backend_parser().parse_args(["--listen", "x", "--model", ns.model])
    for other in _engine_actions(backend_parser()):
        # cpu_affinity: serve's embedded backend defaults to auto (tests/test_cpu_affinity.py)
        if other.dest not in (action.dest, "model", "cpu_affinity"):
            assert getattr(ns, other.dest) == getattr(defaults, other.dest), other.dest
    config = backend_config(ns)
    field = {"no_prefix_caching": "enable_prefix_caching"}.get(action.dest, action.dest)
    if hasattr(config, field):
        expected = not value if action.dest == "no_prefix_caching" else value
        assert getattr(config, field) == expected


def test_no_engine_flags_given_leaves_the_backend_defaults():
    argv = embedded_backend_argv(serve_parser().parse_args([]), "ipc:///tmp/y.sock")
    assert argv[:3] == ["backend", "--listen", "ipc:///tmp/y.sock"]
    # the one flag serve adds of its own: its embedded backend pins itself (--cpu-affinity auto)
    assert argv[3] == "--model" and argv[5:] == ["--cpu-affinity", "auto"]


def test_serve_rejects_a_bad_engine_value_before_starting_anything():
    done = subprocess.run([sys.executable, "-m", "gateway.tidegate_cli", "serve",
                           "--quantization", "int3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2 and "--quantization" in done.stderr


def test_served_tiny_model_obeys_the_flags(tmp_path):
    """A real `tidegate serve` with engine flags: the backend's max_model_len shows in /v1/models,
    its step log (written when it stops) shows at most --max-num-seqs decodes per step and prefill
    chunks no longer than --max-num-batched-tokens."""
    step_log = tmp_path / "steps.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "serve", "--port", "0", "--model", "tiny",
         "--max-model-len", "96", "--max-num-seqs", "2", "--max-num-batched-tokens", "24",
         "--num-blocks", "40", "--step-log", str(step_log), "--cpu-threads", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not (lines and "serving model" in lines[-1]):  # the backend's ready line comes first
            lines.append(proc.stdout.readline())
            assert lines[-1], "".join(lines) + proc.stderr.read()
        m = re.search(r"on (http://\S+)", lines[-1])
        assert m, lines
        url = m.group(1)
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
            assert json.load(resp)["data"][0]["max_model_len"] == 96
        for letter in "xyz":  # three prompts, nothing shared for the prefix cache
            body = json.dumps({"prompt": letter * 40, "max_tokens": 6, "ignore_eos": True}).encode()
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    rows = [json.loads(x) for x in step_log.read_text().splitlines()]
    assert rows, "the backend wrote no step log"
    assert all(r["decodes"] <= 2 and r["prefill_tokens"] <= 24 and r["ms"] > 0 for r in rows)
    assert sum(r["prefill_tokens"] for r in rows) >= 3 * 40  # every prompt was prefilled
    assert max(r["prefill_tokens"] for r in rows) == 24  # a 40-token prompt needed two chunks
