"""Prefix pull by CUDA IPC between two real backend processes on one GPU (issue 34): the puller
maps the peer's pages, copies the prefix device to device, and answers as the peer does.
GPU-marked: runs in `scripts/gpu_kv_pull_run.sh`'s call (`-m gpu`), skipped elsewhere.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [256] + [(7 * i + 3) % 250 for i in range(199)]  # 12 full blocks of 16 to pull
MAX_TOKENS = 6


def start(tmp_path, name: str) -> tuple[subprocess.Popen, str, Path]:
    sock = f"ipc://{tmp_path}/{name}.sock"
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.tidegate_cli", "backend", "--listen", sock,
         "--model", "tiny", "--load-format", "dummy", "--device", "cuda", "--num-blocks", "96",
         "--block-size", "16", "--kv-pull-transport", "cuda-ipc", "--kv-pull-timeout", "20"],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ})
    deadline = time.monotonic() + 240
    while "ready" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"backend {name} did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    return proc, sock, log


def run(client: DealerClient, rid: str, source: str | None = None):
    env = pb.Envelope(batch=pb.Batch(batch_id=1))
    r = env.batch.requests.add(request_id=rid, prompt_frame=0)
    r.sampling.max_tokens, r.sampling.ignore_eos = MAX_TOKENS, True
    if source is not None:
        r.kv_source.endpoint, r.kv_source.num_tokens = source, len(PROMPT) - 1
    client.send(env, [PROMPT])
    tokens, finals, _ = client.collect([rid], timeout_s=120)
    return tokens[rid], finals[rid]


def report(client: DealerClient) -> pb.LoadReport:
    client.send(pb.Envelope(health=pb.Health(nonce=1)))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = client.recv(10)
        if m.kind == "load_report":
            return m.envelope.load_report
    pytest.fail("no LoadReport")


def test_a_prefix_pulled_by_cuda_ipc_answers_as_the_peer_does(tmp_path):
    peer, peer_sock, _ = start(tmp_path, "peer")
    me, me_sock, me_log = start(tmp_path, "me")
    pc, mc = DealerClient(peer_sock), DealerClient(me_sock)
    try:
        pc.hello()
        mc.hello()
        want, _ = run(pc, "warm")
        got, final = run(mc, "r", source=peer_sock + ".kv")   # the peer's KV socket
        assert final.num_cached_tokens == 192, me_log.read_text()[-2000:]
        assert got == want
        rep = report(mc)
        assert (rep.num_kv_pulls, rep.num_kv_pull_failures, rep.num_kv_pulls_ipc) == (1, 0, 1)
        assert "mapping the peer's pages failed" not in me_log.read_text()
    finally:
        pc.close()
        mc.close()
        for p in (me, peer):
            p.terminate()
            p.wait(30)
