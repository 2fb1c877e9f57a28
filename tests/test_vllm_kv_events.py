"""KV events against vLLM itself (issue 33), with vLLM's CPU build (`make test-vllm`, which points
TIDEGATE_VLLM_PYTHON at its interpreter; skipped otherwise). vLLM runs in that interpreter as a
subprocess, so this test process never imports it.

- vLLM's own `KVEventBatch` decoder (vllm.distributed.kv_events, msgspec) reads a tidegate
  backend's published batches, and the blocks it reconstructs are the block manager's cache.
- vLLM's engine publishing with `kv_events_config` (its ZMQ publisher): the gateway's subscriber and
  mirror (gateway.kv_events) give exactly the sampled-depth prefix hashes of the blocks vLLM
  computed, in tidegate's hashing, so the gateway's placement can route by them.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from scheduler.block_manager import ROOT_HASH, BlockManager
from scheduler.prefix_index import DEPTHS, prefix_hashes

VLLM_PYTHON = os.environ.get("TIDEGATE_VLLM_PYTHON", "")
REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "tiny-coder"
U64 = (1 << 64) - 1

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(
    not (VLLM_PYTHON and Path(VLLM_PYTHON).exists() and (MODEL / "config.json").exists()),
    reason="needs vLLM's CPU build (make test-vllm) and models/tiny-coder")]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


_DECODE = """
import json, sys
import msgspec
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                        KVEventBatch)
dec = msgspec.msgpack.Decoder(type=KVEventBatch)
held = {}
for hexed in json.loads(sys.stdin.read()):
    batch = dec.decode(bytes.fromhex(hexed))
    for ev in batch.events:
        if isinstance(ev, AllBlocksCleared):
            held.clear()
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                del held[(ev.medium, h)]
        else:
            assert isinstance(ev, BlockStored)
            parent, bs = ev.parent_block_hash, ev.block_size
            for i, h in enumerate(ev.block_hashes):
                held[(ev.medium, h)] = [parent, ev.token_ids[i * bs:(i + 1) * bs]]
                parent = h
print("RESULT " + json.dumps([[m, h, p, t] for (m, h), (p, t) in held.items()]))
"""


def test_vllms_decoder_reads_a_tidegate_backends_events():
    from backend.server.kv_events import encode_batch

    rng = random.Random(5)
    bm = BlockManager(num_blocks=40, block_size=16, num_host_blocks=12)
    bm.record_kv_events()
    payloads = []
    shared = [rng.randrange(8000) for _ in range(48)]
    for i in range(200):
        toks = shared[:16 * rng.randint(0, 3)] + [rng.randrange(8000) for _ in range(
            rng.randint(1, 60))]
        bm.allocate(i, toks)
        bm.cache_blocks(i, toks, len(toks))
        bm.free(i)
        entries = bm.take_kv_events()
        if entries:
            payloads.append(encode_batch(entries, 16).hex())
    out = subprocess.run([VLLM_PYTHON, "-c", _DECODE], input=json.dumps(payloads),
                         capture_output=True, text=True, timeout=600, env=_env(), check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out.stderr[-3000:]
    got = {(m, h): (p, tuple(t)) for m, h, p, t in json.loads(line[len("RESULT "):])}

    def want(medium, keys):
        return {(medium, hash(k) & U64): (None if k[0] == ROOT_HASH else k[0] & U64, k[1])
                for k in keys}
    assert got == {**want("GPU", bm.cached_prefixes()), **want("CPU", bm.host.cached_keys())}
    assert bm.num_evictions > 50 and bm.host.num_dropped_blocks > 0


_PUBLISH = """
import json, os, sys, time
from vllm import LLM, SamplingParams
from vllm.config import KVEventsConfig
from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash
prompts = json.loads(sys.stdin.read())
# 16 blocks of the CPU build's 128 tokens: the prompts below need more, so blocks are evicted
llm = LLM(model=sys.argv[1], max_model_len=512, max_num_seqs=4, enforce_eager=True,
          dtype="float32", seed=0, enable_prefix_caching=True, num_gpu_blocks_override=16,
          kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                          endpoint=sys.argv[2], replay_endpoint=sys.argv[3],
                                          topic="kv@tiny-coder"))
outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                    SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                   detokenize=False), use_tqdm=False)
pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
held = [maybe_convert_block_hash(get_block_hash(k))
        for k in pool.cached_block_hash_to_block._cache]
print("RESULT " + json.dumps({"outputs": [list(o.outputs[0].token_ids) for o in outs],
      "block_size": llm.llm_engine.vllm_config.cache_config.block_size, "held": held}),
      flush=True)
while not os.path.exists(sys.argv[4]):  # stay up (its publisher too) until the test has read
    time.sleep(0.1)                     # every batch
"""


def test_gateway_mirrors_vllms_own_events():
    """vLLM (16 blocks of 128 tokens, evicting) publishes; the gateway's mirror holds exactly the
    hashes in vLLM's block pool at the end, and its sampled-depth hashes are tidegate's hashes of
    those blocks' tokens (re-chunked from 128 to the gateway's 16)."""
    from gateway.kv_events import KVEventMirror, KVEventSubscriber

    rng = random.Random(11)
    systems = [[rng.randrange(3, 8000) for _ in range(400)] for _ in range(12)]
    prompts = [rng.choice(systems)[:rng.choice([130, 260, 400])]
               + [rng.randrange(3, 8000) for _ in range(rng.randint(1, 90))] for _ in range(40)]
    tmp = tempfile.gettempdir()
    tag = uuid.uuid4().hex[:8]
    pub, replay = f"ipc://{tmp}/vllm-kv-{tag}.pub", f"ipc://{tmp}/vllm-kv-{tag}.replay"
    go = Path(tmp) / f"vllm-kv-{tag}.go"  # made when the publisher may stop

    async def run():
        mirror = KVEventMirror(block_size=16)
        sub = KVEventSubscriber(pub, mirror, replay, topic="kv@")
        task = asyncio.create_task(sub.run())
        await sub.ready.wait()
        proc = await asyncio.create_subprocess_exec(
            VLLM_PYTHON, "-c", _PUBLISH, str(MODEL), pub, replay, str(go),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_env(), cwd=tmp)
        proc.stdin.write(json.dumps(prompts).encode())
        proc.stdin.close()
        result = None
        try:
            while True:
                line = (await asyncio.wait_for(proc.stdout.readline(), 900)).decode()
                if not line:
                    err = (await proc.stderr.read()).decode()[-3000:]
                    pytest.fail(f"vLLM ended: {err}")
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
                    break
            for _ in range(100):  # vLLM's publisher thread sends a little after the step
                await asyncio.sleep(0.05)
            return result, mirror, sub
        finally:
            go.touch()
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except asyncio.TimeoutError:
                proc.kill()
            task.cancel()

    try:
        result, mirror, sub = asyncio.run(run())
    finally:
        go.unlink(missing_ok=True)
    assert result["block_size"] == 128  # vLLM CPU's: re-chunked to the gateway's 16
    assert sub.num_bad == 0 and sub.num_gaps == 0 and mirror.num_unplaced == 0
    held = set(result["held"])
    assert mirror.block_hashes("GPU") == held
    assert len(mirror._gone) > 0 and len(held) > 4  # blocks were evicted, others are held
    # each held block's tidegate hashes at the sampled depths (re-chunked from its tokens)
    want: set[int] = set()
    for h in held:
        done = mirror.blocks[h][3]
        want |= {chain for k, chain in done if k in DEPTHS}
    assert set(mirror.prefix_hashes()) == want and want
    # and they are the prompts' (prompt + outputs) own prefix hashes
    assert want <= {x for p, o in zip(prompts, result["outputs"]) for x in prefix_hashes(p + o, 16)}


def test_backend_engine_vllm_publishes_vllms_own_events():
    """`tidegate backend --engine vllm --kv-events-endpoint`: the flags become vLLM's
    KVEventsConfig; its events (read back by replay from 0) carry the request's blocks."""
    from gateway.kv_events import KVEventMirror, decode_batch
    from tests.backend_helpers import DealerClient

    tmp, tag = tempfile.gettempdir(), uuid.uuid4().hex[:8]
    listen = f"ipc://{tmp}/tg-vllm-{tag}.sock"
    pub, replay = f"ipc://{tmp}/tg-vllm-{tag}.pub", f"ipc://{tmp}/tg-vllm-{tag}.replay"
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "gateway.tidegate_cli", "backend", "--engine", "vllm",
         "--model", str(MODEL), "--listen", listen, "--max-model-len", "512",
         "--max-num-seqs", "4", "--enforce-eager", "--kv-events-endpoint", pub,
         "--kv-events-replay-endpoint", replay, "--kv-events-topic", "kv@t"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**_env(), "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("tidegate backend ready"):
                break
        else:
            pytest.fail(f"did not start: {''.join(lines)[-2000:]} {proc.stderr.read()[-2000:]}")
        client = DealerClient(listen)
        client.hello()
        prompt = list(range(10, 10 + 300))
        client.batch({"a": prompt}, max_tokens=4, ignore_eos=True)
        _, finals, _ = client.collect(["a"], timeout_s=300)
        assert "a" in finals and not client.errors
        client.close()
        import time

        import zmq
        mirror = KVEventMirror(block_size=16)
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(replay)
        deadline = time.monotonic() + 30
        while not mirror.media and time.monotonic() < deadline:  # vLLM's thread sends soon
            mirror = KVEventMirror(block_size=16)
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            while dealer.poll(2000):
                _, topic, _, payload = dealer.recv_multipart()  # vLLM 0.32: [topic, seq, payload]
                if not payload:
                    break
                assert topic == b"kv@t"
                mirror.apply(decode_batch(payload)[1])
        dealer.close()
        # the CPU build's 128-token blocks: 2 full blocks of the 300-token prompt
        assert len(mirror.block_hashes("GPU")) == 2
        assert set(mirror.prefix_hashes()) == set(prefix_hashes(prompt[:256] + [0], 16))
    finally:
        proc.terminate()
        proc.wait(60)
