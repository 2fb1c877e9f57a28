"""KV events in vLLM's format (issue 33): a tidegate backend's events, read by a decoder written
here from vLLM's documented format (not our encoder's code, not gateway.kv_events), reproduce the
backend's prefix cache exactly; the gateway's consumer (gateway.kv_events) gives the same
sampled-depth prefix hashes the block manager holds.

vLLM's format as documented (vllm/distributed/kv_events.py, examples/online_serving/
kv_events_subscriber.py; map-shaped events since vLLM PR #42892): PUB message
[topic, seq (8 bytes big-endian), msgpack([ts, events, dp_rank])]; an event is
{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium",
...}, {"type": "BlockRemoved", "block_hashes", "medium", ...} or {"type": "AllBlocksCleared"};
stored block i's parent is block i-1, the first's is parent_block_hash (None: a first block).
"""
import asyncio
import random
import threading
import time

import msgpack
import pytest
import zmq

from scheduler.block_manager import ROOT_HASH, BlockManager
from scheduler.prefix_index import DEPTHS

U64 = (1 << 64) - 1


# ---- the independent decoder ----------------------------------------------------------------
class VllmFormatReader:
    """Per medium: block hash -> (parent hash or None, token ids), from vLLM-format messages."""

    def __init__(self, topic: bytes = b"") -> None:
        self.topic = topic
        self.blocks: dict[str, dict[int, tuple]] = {}
        self.next_seq = 0
        self.num_events = 0

    def message(self, frames: list[bytes]) -> None:
        topic, seq, payload = frames
        assert topic == self.topic
        assert len(seq) == 8 and int.from_bytes(seq, "big") == self.next_seq, "a gap"
        self.next_seq += 1
        ts, events, dp_rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and dp_rank == 0
        for ev in events:
            self.num_events += 1
            kind = ev["type"]
            if kind == "AllBlocksCleared":
                self.blocks.clear()
                continue
            held = self.blocks.setdefault(ev["medium"], {})
            if kind == "BlockRemoved":
                for h in ev["block_hashes"]:
                    del held[h]  # KeyError: a removal of a block never stored
                continue
            assert kind == "BlockStored"
            bs, tokens, parent = ev["block_size"], ev["token_ids"], ev["parent_block_hash"]
            assert len(tokens) == bs * len(ev["block_hashes"])
            for i, h in enumerate(ev["block_hashes"]):
                assert 0 <= h <= U64
                assert h not in held, "stored twice without a removal"
                held[h] = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
                parent = h


def expected_blocks(keys) -> dict[int, tuple]:
    """The block manager's keys as the reader should hold them."""
    return {hash(k) & U64: (None if k[0] == ROOT_HASH else k[0] & U64, k[1]) for k in keys}


# ---- the block manager alone: every path that changes the cache's keys ------------------------
def test_block_manager_records_every_change_of_its_keys():
    from backend.server.kv_events import encode_batch

    rng = random.Random(3)
    bm = BlockManager(num_blocks=24, block_size=4, num_host_blocks=10)
    bm.record_kv_events()
    reader = VllmFormatReader()
    shared = [rng.randrange(500) for _ in range(12)]
    live: dict[int, list[int]] = {}
    for step in range(600):
        if live and (rng.random() < 0.4 or len(live) >= 4):
            sid = rng.choice(list(live))
            toks = live.pop(sid)
            bm.cache_blocks(sid, toks, len(toks))
            bm.free(sid)
        else:
            toks = (shared[:rng.choice([0, 4, 8, 12])]
                    + [rng.randrange(500) for _ in range(rng.randrange(1, 14))])
            if bm.can_allocate(toks):
                bm.allocate(step, toks)
                live[step] = toks
        entries = bm.take_kv_events()
        if entries:
            reader.message([b"", reader.next_seq.to_bytes(8, "big"), encode_batch(entries, 4)])
        assert reader.blocks.get("GPU", {}) == expected_blocks(bm.cached_prefixes())
        assert reader.blocks.get("CPU", {}) == expected_blocks(bm.host.cached_keys())
    bm.check_integrity()
    assert bm.num_evictions > 50 and bm.num_host_hit_tokens > 0 and bm.host.num_dropped_blocks > 0


def test_recording_off_keeps_nothing_and_on_starts_with_a_snapshot():
    bm = BlockManager(num_blocks=8, block_size=2)
    bm.allocate("a", [1, 2, 3, 4, 5])
    bm.cache_blocks("a", [1, 2, 3, 4, 5], 5)
    assert bm.kv_events is None and bm.take_kv_events() == []
    bm.record_kv_events()
    entries = bm.take_kv_events()
    assert [e[0] for e in entries] == [2, 0, 0]  # cleared, then both held blocks
    assert {e[2] for e in entries[1:]} == set(bm.cached_prefixes())
    assert bm.take_kv_events() == []


def test_array_format_is_vllms_earlier_positional_events():
    from backend.server.kv_events import encode_batch
    from scheduler.block_manager import KV_CLEARED, KV_REMOVED, KV_STORED

    k0 = (ROOT_HASH, (1, 2))
    k1 = (hash(k0), (3, 4))
    entries = [(KV_CLEARED, "GPU", None), (KV_STORED, "GPU", k0), (KV_STORED, "GPU", k1),
               (KV_REMOVED, "GPU", k1)]
    ts, events, dp = msgpack.unpackb(encode_batch(entries, 2, fmt="array", ts=1.5))
    assert ts == 1.5 and dp == 0
    assert events == [["AllBlocksCleared"],
                      ["BlockStored", [hash(k0) & U64, hash(k1) & U64], None, [1, 2, 3, 4], 2,
                       None, "GPU", None],
                      ["BlockRemoved", [hash(k1) & U64], "GPU"]]
    # the same batch as maps: one BlockStored for the chain, the first block's parent None
    _, events, _ = msgpack.unpackb(encode_batch(entries, 2))
    assert events[1]["type"] == "BlockStored" and events[1]["parent_block_hash"] is None
    assert events[1]["block_hashes"] == [hash(k0) & U64, hash(k1) & U64]
    assert events[2] == {"type": "BlockRemoved", "block_hashes": [hash(k1) & U64],
                         "medium": "GPU", "group_idx": 0}


# ---- the gateway's consumer -------------------------------------------------------------------
def _stored(hashes, parent, tokens, bs, medium="GPU"):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": bs, "lora_id": None, "medium": medium,
            "lora_name": None}


def test_gateway_mirror_maps_vllm_hashes_onto_tidegate_chain_hashes():
    """A vLLM backend's hashes are its own (sha256): the mirror places its blocks in tidegate's
    chain from their tokens, also when the engine's block size is not the gateway's."""
    from gateway.kv_events import KVEventMirror, decode_batch
    from scheduler.prefix_index import prefix_hashes

    prompt = list(range(100, 100 + 70))
    want = prefix_hashes(prompt, 4)  # depths 1, 2, 4, 8, 16 of 4-token blocks
    for engine_bs in (4, 8, 2):
        n = 64 // engine_bs  # 64 tokens stored
        hashes = [0xF000 + i for i in range(n)]
        for fmt in ("map", "array"):
            ev = _stored(hashes, None, prompt[:64], engine_bs)
            if fmt == "array":
                ev = ["BlockStored", *[ev[k] for k in ("block_hashes", "parent_block_hash",
                                                      "token_ids", "block_size", "lora_id",
                                                      "medium", "lora_name")]]
            mirror = KVEventMirror(block_size=4)
            _, events, _ = decode_batch(msgpack.packb([1.0, [ev], 0]))
            mirror.apply(events)
            assert set(mirror.prefix_hashes()) == set(want), (engine_bs, fmt)
            # the block completing tokens 32..63 goes: depth 16 is no longer held
            last = hashes[-1]
            _, events, _ = decode_batch(msgpack.packb(
                {"ts": 2.0, "events": [{"type": "BlockRemoved", "block_hashes": [last],
                                        "medium": "GPU"}]}))
            mirror.apply(events)
            assert set(mirror.prefix_hashes()) == set(want[:-1])
            # stored again, under a parent removed meanwhile: placed from memory
            mirror.apply([*decode_batch(msgpack.packb([3.0, [_stored([last], hashes[-2],
                          prompt[64 - engine_bs:64], engine_bs)]]))[1]])
            assert set(mirror.prefix_hashes()) == set(want)
            mirror.apply(decode_batch(msgpack.packb([4.0, [{"type": "AllBlocksCleared"}]]))[1])
            assert mirror.prefix_hashes() == [] and not mirror.media


def test_gateway_decoder_refuses_malformed_batches():
    from gateway.kv_events import KVEventFormatError, decode_batch

    for bad in (b"\xc1", msgpack.packb(7), msgpack.packb([1.0, 5]),
                msgpack.packb([1.0, [{"type": "Nope"}]]),
                msgpack.packb([1.0, [_stored([1, 2], None, [1, 2, 3], 2)]])):
        with pytest.raises(KVEventFormatError):
            decode_batch(bad)


def test_subscriber_fills_a_gap_by_replay_and_clears_on_restart():
    from backend.server.kv_events import KVEventPublisher
    from gateway.kv_events import KVEventMirror, KVEventSubscriber

    async def run():
        bm = BlockManager(num_blocks=64, block_size=2)
        bm.record_kv_events()
        port_pub = f"ipc:///tmp/tg-kvev-{id(bm)}.pub"
        port_replay = f"ipc:///tmp/tg-kvev-{id(bm)}.replay"
        pub = KVEventPublisher(port_pub, 2, port_replay, topic="kv")
        mirror = KVEventMirror(block_size=2)
        sub = KVEventSubscriber(port_pub, mirror, port_replay, topic="kv")
        # batches 0..2 are sent before anyone listens: the first message seen is a gap
        seqs = []
        for i in range(6):
            toks = [10 * i + j for j in range(5)]
            bm.allocate(i, toks)
            bm.cache_blocks(i, toks, 5)
            bm.free(i)
            pub.publish(bm.take_kv_events())
            if i == 2:
                while pub.num_batches < 3:
                    await asyncio.sleep(0.01)
                task = asyncio.create_task(sub.run())
                await sub.ready.wait()
                await asyncio.sleep(0.3)  # the slow joiner: SUB connected before batch 3
            seqs.append(i)
        deadline = time.monotonic() + 5
        while sub.last_seq < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert sub.last_seq == 5 and sub.num_gaps == 1 and sub.num_replayed == 3
        want = {hash(k) & U64 for k in bm.cached_prefixes()}
        assert mirror.block_hashes() == want and not mirror.stale
        # 5-token prompts of 2-token blocks: every cached block is at depth 1 or 2, both sampled
        assert set(mirror.prefix_hashes()) == {hash(k) for k in bm.cached_prefixes()}
        # the publisher restarts (a new process): sequence 0 again, a fresh cache
        pub.close()
        bm2 = BlockManager(num_blocks=64, block_size=2)
        bm2.record_kv_events()
        bm2.allocate("x", [7, 8, 9])
        bm2.cache_blocks("x", [7, 8, 9], 3)
        pub = KVEventPublisher(port_pub, 2, port_replay, topic="kv")
        await asyncio.sleep(0.3)
        pub.publish(bm2.take_kv_events())
        deadline = time.monotonic() + 5
        while sub.num_restarts == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert sub.num_restarts == 1 and mirror.block_hashes() == {hash(k) & U64 for k in
                                                                   bm2.cached_prefixes()}
        task.cancel()
        pub.close()

    asyncio.run(run())


# ---- the goal: a tidegate backend over 1,000 requests ------------------------------------------
def _workload(rng: random.Random, vocab: int, n: int) -> list[list[int]]:
    """Prompts sharing a few system prompts, some extending an earlier prompt (a follow-up)."""
    systems = [[rng.randrange(vocab) for _ in range(rng.randrange(8, 33))] for _ in range(6)]
    out: list[list[int]] = []
    for _ in range(n):
        r = rng.random()
        if out and r < 0.25:
            base = rng.choice(out[-50:])
        elif r < 0.85:
            base = rng.choice(systems)
        else:
            base = []
        out.append(base + [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))])
    return out


@pytest.mark.parametrize("host_tier", [False, True], ids=["gpu", "host-tier"])
def test_tidegate_backend_events_reproduce_its_prefix_index(tmp_path, host_tier):
    """1,000 requests through a real worker (tiny preset, CPU) publishing on ipc://: after every
    wave the reader's blocks are exactly the block manager's cache (and host tier), and the
    gateway consumer's sampled-depth hashes are exactly those the block manager holds."""
    from backend.engine.assemble import BackendConfig, create_engine
    from backend.server.kv_events import KVEventPublisher
    from backend.server.worker import Worker
    from gateway.kv_events import KVEventMirror, decode_batch
    from tests.backend_helpers import DealerClient

    bs = 4
    engine, loaded = create_engine(BackendConfig(
        model="tiny", load_format="dummy", block_size=bs, num_blocks=96, max_num_seqs=16,
        max_num_batched_tokens=256, host_kv_gib=(0.0004 if host_tier else 0.0)))
    bm = engine.scheduler.block_manager
    assert (bm.host is not None) == host_tier
    pub = KVEventPublisher(f"ipc://{tmp_path}/kv.pub", bs, topic="kv@tiny")
    worker = Worker(engine, loaded, f"ipc://{tmp_path}/w.sock", kv_events=pub)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(pub.endpoint)
    time.sleep(0.3)  # the subscription reaches the PUB before the first batch
    reader = VllmFormatReader(b"kv@tiny")
    mirror = KVEventMirror(block_size=bs)
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    client = DealerClient(worker.endpoint)
    rng = random.Random(7)
    seen: dict[int, tuple] = {}  # chain hash -> key, over every request's tokens

    def candidates(tokens):
        parent = ROOT_HASH
        for i in range(len(tokens) // bs):
            key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
            parent = hash(key)
            seen[parent] = (i + 1, key)

    try:
        client.hello()
        prompts = _workload(rng, loaded.config.vocab_size - 8, 1000)
        waves, num_checked = 0, 0
        for start in range(0, len(prompts), 50):
            wave = {f"r{start + i}": p for i, p in enumerate(prompts[start:start + 50])}
            client.batch(wave, max_tokens=rng.randrange(1, 9), ignore_eos=True)
            tokens, finals, _ = client.collect(list(wave), timeout_s=60)
            assert not client.errors and len(finals) == len(wave)
            for rid, p in wave.items():
                candidates(p + tokens[rid])
            # the worker is idle now: its last turn's batch is queued; read up to it
            deadline = time.monotonic() + 10
            while reader.next_seq < pub.num_queued:
                assert time.monotonic() < deadline, "events stopped coming"
                if sub.poll(100):
                    frames = sub.recv_multipart()
                    reader.message(frames)
                    mirror.apply(decode_batch(frames[2])[1])
            waves += 1
            cached = bm.cached_prefixes()
            assert reader.blocks.get("GPU", {}) == expected_blocks(cached)
            host_keys = bm.host.cached_keys() if bm.host is not None else []
            assert reader.blocks.get("CPU", {}) == expected_blocks(host_keys)
            # the prefix index at the placement's sampled depths
            held = {h for h, (depth, key) in seen.items()
                    if depth in DEPTHS and bm.is_cached(key)}
            assert set(mirror.prefix_hashes()) == held
            assert mirror.block_hashes("GPU") == {hash(k) & U64 for k in cached}
            num_checked += len(cached)
        assert waves == 20 and num_checked > 1000
        assert bm.num_evictions > 500  # removals were exercised, not only stores
        if host_tier:
            assert bm.host.num_dropped_blocks > 0 and bm.num_host_hit_tokens > 0
        assert reader.num_events > 1000
    finally:
        worker._stopping = True
        thread.join(10)
        client.close()
        sub.close()
    assert worker.kv_events is None  # closed with the worker


def test_gateway_places_by_a_vllm_backends_events():
    """tidegate's placement consuming a vLLM server's events: a PUB in the test sends what vLLM
    sends (its own sha256-derived hashes, 16-token blocks); the prompt whose prefix that backend
    holds goes there, a cold one does not."""
    from types import SimpleNamespace

    from gateway.kv_events import KVEventFacts
    from scheduler.placement import PlacementConfig
    from scheduler.placements import create_placement
    from scheduler.prefix_index import prefix_hashes

    async def run(tmp):
        placement = create_placement(PlacementConfig(policy="prefix", block_size=16))
        for b in (0, 1):
            placement.add_backend(b)
        pool = SimpleNamespace(placement=placement, backends=[
            SimpleNamespace(address="http://a:8000", pid=0),
            SimpleNamespace(address="http://b:8000/", pid=1)])
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{tmp}/vllm.pub"
        pub.bind(endpoint)
        facts = KVEventFacts(pool, "http://b:8000", endpoint, topic="kv@", block_size=16,
                             interval_s=0.02)
        task = asyncio.create_task(facts.run())
        await asyncio.sleep(0.3)
        rng = random.Random(1)
        system = [rng.randrange(30000) for _ in range(130)]
        hashes = [rng.randrange(1 << 64) for _ in range(8)]  # vLLM's, not ours
        stored = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                  "token_ids": system[:128], "block_size": 16, "lora_id": None, "medium": "GPU",
                  "lora_name": None, "extra_keys": [None] * 8, "group_idx": 0,
                  "kv_cache_spec_kind": "full_attention"}
        pub.send_multipart([b"kv@b@model", (0).to_bytes(8, "big"),
                            msgpack.packb([time.time(), [stored], 0])])
        deadline = time.monotonic() + 5
        while placement.index.num_facts(1) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        held = prefix_hashes(system + [1, 2, 3], 16)
        assert placement.index.num_facts(1) == 4 and set(facts.mirror.prefix_hashes()) == set(held)
        now = time.monotonic()
        assert placement.place_one(200, held, now)[0] == 1  # the holder, though 0 is idle
        cold = prefix_hashes([rng.randrange(30000) for _ in range(64)], 16)
        assert placement.place_one(100, cold, now)[0] == 0
        # evicted on the server: the facts follow (the guess made by the placement above
        # keeps only its own TTL)
        pub.send_multipart([b"kv@b@model", (1).to_bytes(8, "big"), msgpack.packb(
            [time.time(), [{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}],
             0])])
        deadline = time.monotonic() + 5
        while placement.index.num_facts(1) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert facts.mirror.prefix_hashes() == [] and placement.index.num_facts(1) == 0
        task.cancel()
        pub.close()

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(tmp))


def test_backend_flag_publishes_and_refuses_an_engine_without_a_prefix_cache(tmp_path):
    """`tidegate backend --kv-events-endpoint`: the process publishes (replay served too); echo,
    which keeps no prefix cache, is refused at start-up with one line."""
    import subprocess
    import sys

    from gateway.kv_events import parse_kv_events_from
    from tests.backend_helpers import DealerClient, WorkerProcess

    assert parse_kv_events_from("http://h:8000/=tcp://h:5557,tcp://h:5558") == (
        "http://h:8000", "tcp://h:5557", "tcp://h:5558")
    with pytest.raises(ValueError):
        parse_kv_events_from("http://h:8000")
    pub_ep, replay_ep = f"ipc://{tmp_path}/ev.pub", f"ipc://{tmp_path}/ev.replay"
    w = WorkerProcess(["--model", "tiny", "--load-format", "dummy", "--num-blocks", "64",
                       "--block-size", "4", "--kv-events-endpoint", pub_ep,
                       "--kv-events-replay-endpoint", replay_ep, "--kv-events-format", "map"],
                      f"ipc://{tmp_path}/w.sock")
    try:
        ctx = zmq.Context.instance()
        c = DealerClient(w.endpoint)
        c.hello()
        c.batch({"a": list(range(1, 12))}, max_tokens=3, ignore_eos=True)
        c.collect(["a"])
        reader = VllmFormatReader()
        # nobody listened on the PUB: every batch from the start-up snapshot on, by replay
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_ep)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            assert dealer.poll(5000)
            _, topic, seq, payload = dealer.recv_multipart()  # vLLM 0.32's replay frames
            if payload == b"":
                assert topic == b"" and int.from_bytes(seq, "big", signed=True) == -1
                break
            reader.message([topic, seq, payload])
        # 11 prompt + 2 computed output tokens: 3 full blocks of 4
        assert len(reader.blocks["GPU"]) == 3
        dealer.close()
        c.close()
    finally:
        assert w.terminate() == 0
    r = subprocess.run([sys.executable, "-m", "gateway.tidegate_cli", "backend", "--model", "echo",
                        "--listen", f"ipc://{tmp_path}/e.sock", "--kv-events-endpoint",
                        f"ipc://{tmp_path}/e.pub"], check=False, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "prefix" in r.stderr and "Traceback" not in r.stderr


def test_vllms_own_struct_declarations_decode_our_batches():
    """msgspec with vLLM's struct declarations (as vllm/distributed/kv_events.py documents them,
    current and pre-PR-42892) decodes what we publish, the way vLLM-side consumers do."""
    msgspec = pytest.importorskip("msgspec")
    from typing import Any

    from backend.server.kv_events import encode_batch
    from scheduler.block_manager import KV_CLEARED, KV_REMOVED, KV_STORED

    Hash = int | bytes  # vLLM's ExternalBlockHash

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[Hash]
        parent_block_hash: Hash | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[Hash]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]

    # before PR 42892: positional events
    class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class OldStored(OldEvent, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None

    class OldRemoved(OldEvent, tag="BlockRemoved"):
        block_hashes: list[int]
        medium: str | None

    class OldCleared(OldEvent, tag="AllBlocksCleared"):
        pass

    class OldBatch(EventBatch):
        events: list[OldStored | OldRemoved | OldCleared]

    k0 = (ROOT_HASH, (5, 6, 7, 8))
    k1 = (hash(k0), (9, 10, 11, 12))
    entries = [(KV_CLEARED, "GPU", None), (KV_STORED, "GPU", k0), (KV_STORED, "GPU", k1),
               (KV_REMOVED, "GPU", k0), (KV_STORED, "CPU", k0)]
    batch = msgspec.msgpack.Decoder(KVEventBatch).decode(encode_batch(entries, 4, ts=2.5))
    assert batch.ts == 2.5 and batch.data_parallel_rank == 0
    cleared, stored, removed, cpu = batch.events
    assert isinstance(cleared, AllBlocksCleared)
    assert stored == BlockStored(block_hashes=[hash(k0) & U64, hash(k1) & U64],
                                 parent_block_hash=None, token_ids=list(range(5, 13)),
                                 block_size=4, lora_id=None, medium="GPU", lora_name=None,
                                 extra_keys=[None, None], group_idx=0,
                                 kv_cache_spec_kind="full_attention")
    assert removed == BlockRemoved(block_hashes=[hash(k0) & U64], medium="GPU", group_idx=0)
    assert cpu.medium == "CPU" and cpu.block_hashes == [hash(k0) & U64]
    old = msgspec.msgpack.Decoder(OldBatch).decode(encode_batch(entries, 4, fmt="array"))
    assert [type(e) for e in old.events] == [OldCleared, OldStored, OldRemoved, OldStored]
    assert old.events[1].block_hashes == stored.block_hashes and old.events[1].medium == "GPU"
    # and the gateway's decoder reads what msgspec writes with vLLM's declarations
    from gateway.kv_events import decode_batch

    ours = msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[stored, removed],
                                               data_parallel_rank=0))
    _, evs, dp = decode_batch(ours)
    assert dp == 0 and [e.kind for e in evs] == ["BlockStored", "BlockRemoved"]
    assert evs[0].block_hashes == stored.block_hashes and evs[0].token_ids == stored.token_ids
    _, evs, _ = decode_batch(msgspec.msgpack.encode(OldBatch(ts=1.0, events=old.events)))
    assert [e.kind for e in evs] == ["AllBlocksCleared", "BlockStored", "BlockRemoved",
                                     "BlockStored"] and evs[3].medium == "CPU"


def test_serve_takes_both_sides_flags():
    """`tidegate serve` parses --kv-events-from (its own side) and forwards the backend's
    --kv-events-* flags to its embedded backend."""
    from gateway.serve import build_parser, embedded_backend_argv

    args = build_parser().parse_args([
        "--kv-events-endpoint", "tcp://*:5556", "--kv-events-topic", "kv@x",
        "--kv-events-from", "http://h:8000=tcp://h:5557", "--kv-events-from-topic", "kv@"])
    assert args.kv_events_from == ["http://h:8000=tcp://h:5557"]
    assert args.kv_events_from_topic == "kv@"
    argv = embedded_backend_argv(args, "ipc:///tmp/x.sock")
    i = argv.index("--kv-events-endpoint")
    assert argv[i + 1] == "tcp://*:5556" and argv[argv.index("--kv-events-topic") + 1] == "kv@x"
    assert "--kv-events-from" not in argv


def test_mirror_counts_copies_of_a_hash():
    """vLLM caches a prefix computed by two requests at once in two blocks (no de-duplication):
    two BlockStored, later two BlockRemoved; the hash stays held until the second removal."""
    from gateway.kv_events import KVEventMirror, decode_batch

    mirror = KVEventMirror(block_size=2)

    def send(*events):
        mirror.apply(decode_batch(msgpack.packb([1.0, list(events), 0]))[1])

    send(_stored([11], None, [1, 2], 2), _stored([11], None, [1, 2], 2),
         _stored([11], None, [1, 2], 2, medium="CPU"))
    removed = {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}
    send(removed)
    assert mirror.holds(11, "GPU") and mirror.prefix_hashes() == [hash((ROOT_HASH, (1, 2)))]
    send(removed)
    assert not mirror.holds(11, "GPU") and mirror.holds(11, "CPU")
    send({"type": "BlockRemoved", "block_hashes": [11], "medium": "CPU"})
    assert not mirror.holds(11) and mirror.prefix_hashes() == []
    send(removed)  # a removal of what is not held changes nothing
    assert not mirror.media
