"""`tidegate backend --engine vllm`: vLLM's engine behind our wire gives the tokens vLLM gives by
itself (greedy, same prompts), honours Abort, and reports load from vLLM's own counters.

Runs with `make test-vllm` (it points TIDEGATE_VLLM_PYTHON at the interpreter of vLLM's CPU build,
set up by ../shared/peers/vllm-cpu/setup.sh); skipped otherwise. Both sides run in that
interpreter as subprocesses (our backend with this checkout on PYTHONPATH, and vLLM's `LLM` for
the reference), so this test process never imports vLLM.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from proto import tidegate_pb2 as pb
from tests.backend_helpers import DealerClient

VLLM_PYTHON = os.environ.get("TIDEGATE_VLLM_PYTHON", "")
REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "tiny-coder"
NUM_NEW = 16
PROMPTS = {"a": [1, 5, 6, 7, 8, 9, 10, 11, 12], "b": [1, 100, 200, 300],
           "c": [1] + list(range(40, 90))}

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(
    not (VLLM_PYTHON and Path(VLLM_PYTHON).exists() and (MODEL / "config.json").exists()),
    reason="needs vLLM's CPU build (make test-vllm) and models/tiny-coder")]

_REFERENCE = """
import json, os, sys
from vllm import LLM, SamplingParams
prompts = json.loads(sys.stdin.read())
llm = LLM(model=sys.argv[1], max_model_len=512, max_num_seqs=8, enforce_eager=True,
          dtype="float32", seed=0)
outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                    SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True,
                                   detokenize=False))
print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_reference(prompts: list[list[int]]) -> list[list[int]]:
    out = subprocess.run([VLLM_PYTHON, "-c", _REFERENCE, str(MODEL), str(NUM_NEW)],
                         input=json.dumps(prompts), capture_output=True, text=True, timeout=900,
                         env={**_env(), "PYTHONPATH": ""}, check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def vllm_backend():
    endpoint = f"ipc://{tempfile.gettempdir()}/tg-vllm-{uuid.uuid4().hex[:8]}.sock"
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "gateway.tidegate_cli", "backend", "--engine", "vllm",
         "--model", str(MODEL), "--listen", endpoint, "--max-model-len", "512",
         "--max-num-seqs", "8", "--enforce-eager"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    try:
        lines = []
        for line in proc.stdout:          # vLLM logs on stdout too: read up to our ready line
            lines.append(line)
            if line.startswith("tidegate backend ready"):
                break
        else:
            proc.kill()
            pytest.fail(f"vLLM backend did not start: {''.join(lines)[-3000:]} "
                        f"{proc.stderr.read()[-3000:]}")
        yield endpoint
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_greedy_tokens_equal_vllms_own(vllm_backend):
    c = DealerClient(vllm_backend)
    info = c.hello()
    assert info.model == "tiny-coder" and info.vocab_size == 4096 and info.num_kv_blocks > 0
    assert '"model"' in info.tokenizer_json
    c.batch(PROMPTS, max_tokens=NUM_NEW, ignore_eos=True)
    tokens, finals, _ = c.collect(list(PROMPTS), timeout_s=600)
    assert not c.errors
    want = vllm_reference(list(PROMPTS.values()))
    for rid, ref in zip(PROMPTS, want):
        assert tokens[rid] == ref, rid
        assert finals[rid].finish_reason == pb.RequestOutput.LENGTH
        assert finals[rid].num_completion_tokens == NUM_NEW
    c.close()


def test_abort_bad_input_and_load_reports(vllm_backend):
    c = DealerClient(vllm_backend)
    c.hello()
    c.batch({"bad": [1, 99999]}, max_tokens=4)             # outside the vocabulary
    c.batch({"long": PROMPTS["c"]}, max_tokens=400, ignore_eos=True)
    time.sleep(0.5)
    from proto import codec
    c.send(codec.make_abort(["long"]))
    tokens, finals, _ = c.collect(["bad", "long"], timeout_s=600)
    assert [e.request_id for e in c.errors] == ["bad"]
    assert c.errors[0].code == pb.Error.INVALID_REQUEST
    assert finals["long"].finish_reason == pb.RequestOutput.ABORT
    assert len(tokens["long"]) < 400
    # the idle edge after the abort, with vLLM's counters: nothing running, every block free
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = c.recv(timeout_s=5)
        if m.kind == "load_report" and m.envelope.load_report.num_running == 0:
            r = m.envelope.load_report
            assert r.num_total_blocks > 0 and r.num_free_blocks == r.num_total_blocks
            assert r.num_prompt_tokens > 0       # vLLM's prefix-cache queries, summed
            break
    else:
        pytest.fail("no idle LoadReport")
    c.close()
