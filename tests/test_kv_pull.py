"""Prefix pull between backends (issue 34): blocks move as stored, a request is answered exactly
once whatever the peer does, and no block leaks on either side.

Two tiny backends run in threads of this process (same dummy weights, seed 0). The peer's
answers in the fault tests come from a fake ROUTER driven here: it dies, stalls, answers late or
sends garbage of several kinds.
"""
import threading
import time
import zlib

import numpy as np
import pytest
import zmq

from backend.kv.transfer import answer_pull
from proto import codec
from proto import tidegate_pb2 as pb
from scheduler.block_manager import BlockManager
from tests.backend_helpers import DealerClient

BS = 16
PROMPT = [256] + [(7 * i + 3) % 250 for i in range(199)]  # 200 tokens: 12 full blocks to pull
MAX_TOKENS = 6
TIMEOUT_S = 0.4


# ---- the block manager's side ----------------------------------------------------------------
def test_held_prefix_and_import_prefix_keep_the_books():
    peer, me = BlockManager(32, 4), BlockManager(32, 4)
    tokens = list(range(1, 23))  # 5 full blocks that can hit (leaving >= 1 token)
    peer.allocate("a", tokens)
    peer.cache_blocks("a", tokens, len(tokens))
    held = peer.held_prefix(tokens)
    assert [on_gpu for on_gpu, _ in held] == [True] * 5
    assert [b for _, b in held] == peer.block_table("a")[:5]
    assert peer.held_prefix(tokens, 2, 2) == held[2:4]
    # the receiver holds the first block itself; it imports blocks 1..4
    me.allocate("x", tokens[:5])
    me.cache_blocks("x", tokens[:5], 5)
    me.free("x")
    assert len(me.match_prefix(tokens)[0]) == 1 and me.can_import(tokens, 4)
    blocks = me.import_prefix(tokens, 1, 4)
    assert len(blocks) == 4 and min(blocks) >= 0 and me.num_used_blocks == 0
    me.check_integrity()
    assert me.allocate("y", tokens) == 20  # the request then hits all five blocks
    me.check_integrity()
    me.free("y")
    assert me.num_free_blocks == 32 and me.held_prefix(tokens) and me.num_used_blocks == 0


def test_import_refuses_without_room_and_takes_nothing():
    me = BlockManager(4, 4)
    tokens = list(range(1, 23))
    me.allocate("busy", list(range(100, 112)))  # 3 of 4 blocks held
    assert not me.can_import(tokens, 2)
    me.check_integrity()
    assert me.num_free_blocks == 1


# ---- two live backends ---------------------------------------------------------------------------
class Backend:
    def __init__(self, tmp_path, name: str, kv_cache_dtype: str = "auto", num_blocks: int = 96,
                 host_kv_gib: float = 0.0, timeout_s: float = TIMEOUT_S, role: int = 0,
                 **worker_kw) -> None:
        from backend.engine.assemble import BackendConfig, create_engine
        from backend.server.worker import Worker

        self.engine, loaded = create_engine(BackendConfig(
            model="tiny", load_format="dummy", block_size=BS, num_blocks=num_blocks,
            max_num_seqs=8, max_num_batched_tokens=128, kv_cache_dtype=kv_cache_dtype,
            host_kv_gib=host_kv_gib))
        self.worker = Worker(self.engine, loaded, f"ipc://{tmp_path}/{name}.sock",
                             kv_pull_timeout_s=timeout_s, role=role, **worker_kw)
        self.thread = threading.Thread(target=self.worker.serve_forever, daemon=True)
        self.thread.start()
        self.client = DealerClient(self.worker.endpoint)
        self.client.hello()

    @property
    def bm(self):
        return self.engine.scheduler.block_manager

    def run(self, rid: str, prompt=PROMPT, source: str | None = None, timeout_s: float = 0.0):
        """One request; (tokens, final output, seconds to its finish)."""
        env = pb.Envelope(batch=pb.Batch(batch_id=1))
        r = env.batch.requests.add(request_id=rid, prompt_frame=0)
        r.sampling.max_tokens, r.sampling.ignore_eos = MAX_TOKENS, True
        if source is not None:
            r.kv_source.endpoint, r.kv_source.num_tokens = source, len(prompt) - 1
            r.kv_source.timeout_s = timeout_s
        t0 = time.monotonic()
        self.client.send(env, [prompt])
        tokens, finals, _ = self.client.collect([rid], timeout_s=60)
        return tokens[rid], finals.get(rid), time.monotonic() - t0

    def report(self) -> pb.LoadReport:
        return self.worker.load_report()

    def assert_no_leak(self) -> None:
        deadline = time.monotonic() + 5
        while self.engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.bm.num_used_blocks == 0 and not self.worker.puller.num_parked
        assert self.bm.num_read_held_blocks == 0  # the KV server released what it read
        self.engine.check_integrity()

    def close(self) -> None:
        self.worker._stopping = True
        self.thread.join(10)
        self.client.close()
        self.worker.close()


def block_bytes_of(backend: Backend, tokens) -> list[bytes]:
    port = backend.worker.puller.port
    _, frames = port.export(tokens, 0)
    return [bytes(row) for f in frames for row in f]


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int4-fp8"])
def test_pull_moves_the_blocks_as_stored_and_the_answer_is_unchanged(tmp_path, kv_cache_dtype):
    peer = Backend(tmp_path, "peer", kv_cache_dtype)
    me = Backend(tmp_path, "me", kv_cache_dtype)
    try:
        want, _, _ = peer.run("warm")                        # the peer now holds the prefix
        got, final, _ = me.run("r", source=peer.worker.endpoint)
        assert final.finish_reason == pb.RequestOutput.LENGTH
        assert final.num_cached_tokens == 192                # 12 blocks, none recomputed
        assert got == want
        assert block_bytes_of(me, PROMPT) == block_bytes_of(peer, PROMPT)  # bit for bit
        rep, prep = me.report(), peer.report()
        assert (rep.num_kv_pulls, rep.num_kv_pull_failures, rep.num_kv_pulled_tokens) == (1, 0, 192)
        assert prep.num_kv_pulls_served == 1 and rep.kv_pull_bytes_per_s > 0
        recomputed, _, _ = me.run("again", prompt=[256, 9, *PROMPT[2:]])  # a cold prompt here
        assert len(recomputed) == MAX_TOKENS
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_pull_from_the_peers_host_tier(tmp_path):
    """The peer's copy of the prefix was evicted to its host tier: it is served from there."""
    peer = Backend(tmp_path, "peer", num_blocks=20, host_kv_gib=0.002)
    me = Backend(tmp_path, "me")
    try:
        want, _, _ = peer.run("warm")
        for k in range(3):  # other prompts push the prefix out of the peer's 20 GPU blocks
            peer.run(f"other{k}", prompt=[256, 100 + k, *PROMPT[2:]])
        held = peer.bm.held_prefix(PROMPT)
        assert len(held) == 12 and not all(on_gpu for on_gpu, _ in held)
        got, final, _ = me.run("r", source=peer.worker.endpoint)
        assert final.num_cached_tokens == 192 and got == want
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_layout_mismatch_is_refused_explicitly_and_recomputed(tmp_path):
    peer = Backend(tmp_path, "peer", "fp8")
    me = Backend(tmp_path, "me", "auto")
    try:
        peer.run("warm")
        got, final, _ = me.run("r", source=peer.worker.endpoint)
        assert final.num_cached_tokens == 0 and len(got) == MAX_TOKENS
        again, final, _ = me.run("again")  # its own blocks now: the same answer
        assert again == got and final.num_cached_tokens == 192
        assert "KV layout differs" in me.worker.puller.last_error
        assert me.report().num_kv_pull_failures == 1
        me.assert_no_leak()
    finally:
        me.close()
        peer.close()


# ---- faults: a fake peer -------------------------------------------------------------------------
class FakePeer:
    """A ROUTER that takes pulls and answers them as `behaviour` says."""

    def __init__(self, tmp_path, behaviour, real_port=None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"ipc://{tmp_path}/fake.sock"
        self.sock.bind(self.endpoint)
        self.behaviour, self.real_port = behaviour, real_port
        self.pulls = 0
        self.stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop:
            if not self.sock.poll(20):
                continue
            identity, *frames = self.sock.recv_multipart()
            msg = codec.decode(frames)
            assert msg.kind == "kv_pull"
            self.pulls += 1
            pull = msg.envelope.kv_pull
            if self.behaviour == "die":
                self.sock.close(linger=0)
                return
            if self.behaviour == "stall":
                continue
            good = answer_pull(self.real_port, pull, msg.arrays[pull.prompt_frame])
            if self.behaviour == "late":
                time.sleep(TIMEOUT_S * 2)
                self.sock.send_multipart([identity, *good])
                continue
            self.sock.send_multipart([identity, *garble(self.behaviour, good)])

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        if not self.sock.closed:
            self.sock.close(linger=0)


def garble(kind: str, frames: list) -> list:
    env = pb.Envelope()
    env.ParseFromString(frames[0])
    r = env.kv_blocks
    data = [bytes(f) for f in frames[1:]]
    if kind == "junk":
        return [b"\xff\x00garbage", b"more"]
    if kind == "error":
        return codec.encode(codec.make_error(pb.Error.BAD_MESSAGE, "a backend does not accept "
                                             "kv_pull messages"))
    if kind == "truncated":
        data[-1] = data[-1][:-4]
    elif kind == "flipped":
        data[0] = bytes([data[0][0] ^ 0xFF]) + data[0][1:]
    elif kind == "unchecked_extra":  # no checksums and one block too many
        del r.frame_crc32[:]
        r.num_blocks += 1
        data.append(data[-1][:r.block_bytes])
    elif kind == "layout":
        r.layout = r.layout.replace("auto", "fp8")
    elif kind == "wrong_start":
        r.start_block += 1
    elif kind == "missing_frame":
        data = data[:-1] if len(data) > 1 else []
    return [env.SerializeToString(), *data]


@pytest.fixture
def pair(tmp_path):
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me")
    want, _, _ = peer.run("warm")
    yield peer, me, want
    me.close()
    peer.close()


@pytest.mark.parametrize("behaviour", ["die", "stall", "late", "junk", "error", "truncated",
                                       "flipped", "unchecked_extra", "layout", "wrong_start",
                                       "missing_frame"])
def test_a_failing_peer_costs_a_recompute_within_the_deadline(tmp_path, pair, behaviour):
    peer, me, want = pair
    fake = FakePeer(tmp_path, behaviour, peer.worker.puller.port)
    try:
        got, final, seconds = me.run("r", source=fake.endpoint)
        assert fake.pulls == 1
        assert final is not None and final.finish_reason == pb.RequestOutput.LENGTH
        assert got == want and final.num_cached_tokens == 0    # recomputed, same answer
        assert not me.client.errors
        assert seconds < TIMEOUT_S + 5.0
        if behaviour in ("die", "stall", "late"):
            assert seconds >= TIMEOUT_S and "timed out" in me.worker.puller.last_error
        rep = me.report()
        assert (rep.num_kv_pulls, rep.num_kv_pull_failures, rep.num_kv_pulled_tokens) == (1, 1, 0)
        if behaviour == "late":
            time.sleep(TIMEOUT_S * 2.5)  # the late answer arrives now: dropped unread
        me.assert_no_leak()
        # exactly once: nothing else arrives for "r"
        assert not me.client.sock.poll(200) or all(
            m.kind == "load_report" for m in [me.client.recv()])
    finally:
        fake.close()


def test_exactly_once_abort_and_duplicate_while_waiting_for_a_pull(tmp_path, pair):
    _, me, _ = pair
    fake = FakePeer(tmp_path, "stall")
    try:
        env = pb.Envelope(batch=pb.Batch(batch_id=7))
        for rid in ("a", "b", "b"):  # "b" twice: the second is refused, the first served once
            r = env.batch.requests.add(request_id=rid, prompt_frame=0)
            r.sampling.max_tokens, r.sampling.ignore_eos = MAX_TOKENS, True
            r.kv_source.endpoint = fake.endpoint
        me.client.send(env, [PROMPT])
        time.sleep(0.1)
        me.client.send(codec.make_abort(["a"]))
        seen: dict[str, list] = {"a": [], "b": []}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (seen["b"] and any(
                getattr(x, "finish_reason", 0) for x in seen["b"])):
            m = me.client.recv(10)
            if m.kind == "error":
                seen[m.envelope.error.request_id].append(m.envelope.error)
            elif m.kind == "step_output":
                for o in m.envelope.step_output.outputs:
                    if o.finish_reason:
                        seen[o.request_id].append(o)
        assert [o.finish_reason for o in seen["a"]] == [pb.RequestOutput.ABORT]
        errors = [x for x in seen["b"] if isinstance(x, pb.Error)]
        finals = [x for x in seen["b"] if not isinstance(x, pb.Error)]
        assert len(errors) == 1 and "duplicate" in errors[0].message
        assert [o.finish_reason for o in finals] == [pb.RequestOutput.LENGTH]
        me.assert_no_leak()
    finally:
        fake.close()


def test_checksums_cover_every_frame():
    """The reply's crc32 list is zlib's over each data frame (what check_reply recomputes)."""
    from backend.kv.transfer import PullError, check_reply

    frame = np.arange(64, dtype=np.uint8).tobytes()
    r = pb.KvBlocks(pull_id=1, start_block=0, num_blocks=2, block_bytes=32, num_frames=1,
                    layout="L", frame_crc32=[zlib.crc32(frame)])
    head, data = check_reply([pb.Envelope(kv_blocks=r).SerializeToString(), frame], "L", 32, 0, 4)
    assert head.num_blocks == 2 and bytes(data[0]) == frame
    r.frame_crc32[0] ^= 1
    with pytest.raises(PullError, match="checksum"):
        check_reply([pb.Envelope(kv_blocks=r).SerializeToString(), frame], "L", 32, 0, 4)


@pytest.mark.parametrize("serve", ["loop", "thread"])
def test_a_prefill_that_never_comes_costs_a_recompute_at_the_deadline(tmp_path, serve):
    """Disaggregated prefill gone wrong: the decode backend's pull asks the peer to wait for a
    prefill that never runs there. The peer holds the pull (deferred), the decode backend gives
    up at its own deadline and recomputes; the peer answers later at its wait's end, and that
    late answer is dropped unread. Nothing leaks on either side, one answer for the request."""
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me")
    try:
        env = pb.Envelope(batch=pb.Batch(batch_id=1))
        r = env.batch.requests.add(request_id="r", prompt_frame=0)
        r.sampling.max_tokens, r.sampling.ignore_eos = MAX_TOKENS, True
        server = peer.worker.kv_server if serve == "thread" else peer.worker.puller
        r.kv_source.endpoint = peer.worker.endpoint if serve == "loop" else server.endpoint
        r.kv_source.num_tokens = len(PROMPT) - 1
        r.kv_source.timeout_s, r.kv_source.prefill_wait_s = TIMEOUT_S, 3 * TIMEOUT_S
        t0 = time.monotonic()
        me.client.send(env, [PROMPT])
        tokens, finals, _ = me.client.collect(["r"], timeout_s=30)
        assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + 5
        assert len(tokens["r"]) == MAX_TOKENS and finals["r"].num_cached_tokens == 0
        assert "timed out" in me.worker.puller.last_error
        assert server._deferred  # still waiting for its prefill
        time.sleep(3 * TIMEOUT_S)
        assert not server._deferred  # answered (nothing held)
        assert peer.report().num_kv_pulls_served == 1
        for b in (peer, me):
            b.assert_no_leak()
        assert me.report().num_kv_pulled_tokens == 0
    finally:
        me.close()
        peer.close()


# ---- pulls served off the peer's step loop (backend.server.kv_serve) -----------------------------
def test_hold_prefix_keeps_blocks_from_eviction_and_the_books_straight():
    bm = BlockManager(8, 4)
    tokens = list(range(1, 23))  # 5 full blocks
    bm.allocate("a", tokens)
    bm.cache_blocks("a", tokens, len(tokens))
    bm.free("a")
    where = bm.hold_prefix(tokens, 1, 3)
    assert [b for _, b in where] == [b for _, b in bm.held_prefix(tokens, 1, 3)]
    assert bm.num_read_held_blocks == 3 and bm.num_free_blocks == 5
    bm.check_integrity()
    bm.allocate("b", list(range(100, 120)))  # 5 blocks: evicts the 5 free ones, not the held 3
    assert bm.held_prefix(tokens, 1, 3) == where
    bm.check_integrity()
    bm.release_prefix(where)
    assert bm.num_read_held_blocks == 0 and bm.num_free_blocks == 3
    bm.check_integrity()
    bm.free("b")
    bm.check_integrity()


def slow_steps(backend, seconds: float):
    """Make every forward pass of `backend` take at least `seconds` while the returned flag is
    set; `flag.entered` is set as each slow forward pass begins, `flag.step` is then the number
    of that step (as its StepOutput will say)."""
    runner, flag = backend.engine.runner, threading.Event()
    flag.entered, flag.step = threading.Event(), 0
    launch = runner.launch

    def slow(*a, **kw):
        if flag.is_set():
            flag.step = backend.worker.num_steps + 1
            flag.entered.set()
            time.sleep(seconds)
        return launch(*a, **kw)
    runner.launch = slow
    return flag


def start_background(backend, rid: str, max_tokens: int = 400):
    env = pb.Envelope(batch=pb.Batch(batch_id=9))
    r = env.batch.requests.add(request_id=rid, prompt_frame=0)
    r.sampling.max_tokens, r.sampling.ignore_eos = max_tokens, True
    backend.client.send(env, [[256, 77, 78, 79]])


def next_step_output(backend) -> int:
    while True:
        m = backend.client.recv(30)
        if m.kind == "step_output":
            return m.envelope.step_output.step


@pytest.mark.parametrize("serve", ["thread", "loop"])
def test_a_busy_peer_answers_a_pull_without_waiting_for_its_step(tmp_path, serve):
    """The peer runs 1.2 s steps. Off its loop (its KV socket) a pull is answered at once; on
    its main socket (the loop) only after the step in progress."""
    step_s = 1.2
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me")
    try:
        want, _, _ = peer.run("warm")
        endpoint = peer.worker.kv_server.endpoint if serve == "thread" else peer.worker.endpoint
        assert peer.worker.backend_info().kv_endpoint == peer.worker.kv_server.endpoint
        flag = slow_steps(peer, step_s)
        flag.set()
        start_background(peer, "busy")
        next_step_output(peer)
        flag.entered.clear()
        assert flag.entered.wait(10)  # a slow step has just begun
        got, final, seconds = me.run("r", source=endpoint, timeout_s=10)
        flag.clear()
        assert got == want and final.num_cached_tokens == 192
        if serve == "thread":
            assert seconds < 0.5 * step_s and peer.worker.kv_server.num_served == 1
        else:
            assert seconds > 0.5 * step_s
        peer.client.send(codec.make_abort(["busy"]))
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_blocks_read_off_the_loop_are_never_overwritten_mid_copy(tmp_path, monkeypatch):
    """The peer's pool is small: its other requests evict the prefix's blocks as soon as they
    are free. A reader that copies them out slowly (50 ms a frame) while the peer steps must get
    exactly the bytes the prefix was computed to, or an explicit 'not held', never a mix; the
    peer's own requests wait for the held blocks and then run. Without the holds
    (`BlockManager.hold_prefix`) the evicting prefills overwrite the blocks mid-copy."""
    from backend.kv.transfer import KVPort, check_reply, make_pull

    peer = Backend(tmp_path, "peer", num_blocks=24)
    try:
        peer.run("warm")
        port, lock = peer.worker.puller.port, peer.worker.kv_lock
        want = block_bytes_of(peer, PROMPT)
        read = KVPort._read

        def slow_read(self, where):
            time.sleep(0.05)
            return read(self, where)
        monkeypatch.setattr(KVPort, "_read", slow_read)
        monkeypatch.setattr(codec, "MAX_FRAME_BYTES", port.block_bytes * 2)  # 6 slow frames
        stop, seen = threading.Event(), {"ok": 0, "not_held": 0}

        def churn():  # prompts sharing nothing with PROMPT: every one evicts its blocks
            k = 0
            while not stop.is_set():
                peer.run(f"churn{k}", prompt=[256, 200 + k % 40, *range(3, 150)])
                k += 1
        t = threading.Thread(target=churn, daemon=True)
        t.start()
        pull = make_pull(1, 0, port.layout, 12).kv_pull
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            frames = answer_pull(port, pull, np.asarray(PROMPT, dtype=np.int32), lock=lock)
            try:
                reply, data = check_reply(frames, port.layout, port.block_bytes, 0, 12)
            except Exception as exc:  # noqa: BLE001
                assert "not held" in str(exc)
                seen["not_held"] += 1
                continue
            got = [bytes(row) for f in data for row in np.frombuffer(f, np.uint8).reshape(
                -1, port.block_bytes)]
            assert got == want[:reply.num_blocks]
            seen["ok"] += 1
        stop.set()
        t.join(30)
        assert seen["ok"] >= 1 and peer.bm.num_read_held_blocks == 0
        peer.assert_no_leak()
    finally:
        peer.close()


def test_a_busy_receiver_lands_the_pull_before_its_next_step(tmp_path):
    """The receiver runs 0.3 s steps for another request. A pulled request parked between two
    steps joins the very next one (the worker holds it for the pull to land), not the one after.
    (A land wait of 0.5 s, not the default 50 ms: this is about the behaviour, on a shared box.)"""
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me", kv_pull_land_wait_s=0.5)
    try:
        peer.run("warm")
        flag = slow_steps(me, 0.3)
        flag.set()
        start_background(me, "busy")
        next_step_output(me)
        flag.entered.clear()
        assert flag.entered.wait(10)
        running = flag.step  # the step running now (0.3 s)
        env = pb.Envelope(batch=pb.Batch(batch_id=1))
        r = env.batch.requests.add(request_id="r", prompt_frame=0)
        r.sampling.max_tokens, r.sampling.ignore_eos = 1, True
        r.kv_source.endpoint, r.kv_source.timeout_s = peer.worker.kv_server.endpoint, 10
        me.client.send(env, [PROMPT])
        first = None
        while first is None:
            m = me.client.recv(30)
            if m.kind == "step_output":
                for o in m.envelope.step_output.outputs:
                    if o.request_id == "r" and o.finish_reason:
                        first = (m.envelope.step_output.step, o.num_cached_tokens)
        flag.clear()
        # sent during `running`, parked after it, in the next one (without the land wait: the
        # one after that)
        assert first == (running + 1, 192)
        me.client.send(codec.make_abort(["busy"]))
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def occupy(backend, rid: str, num_tokens: int, max_tokens: int) -> None:
    """A request of its own holding num_tokens // 16 blocks of `backend` while it decodes."""
    env = pb.Envelope(batch=pb.Batch(batch_id=9))
    r = env.batch.requests.add(request_id=rid, prompt_frame=0)
    r.sampling.max_tokens, r.sampling.ignore_eos = max_tokens, True
    backend.client.send(env, [[256] + [(11 * i + 5) % 250 for i in range(num_tokens - 1)]])


def send_pulled(backend, rid: str, source: str, timeout_s: float) -> None:
    env = pb.Envelope(batch=pb.Batch(batch_id=1))
    r = env.batch.requests.add(request_id=rid, prompt_frame=0)
    r.sampling.max_tokens, r.sampling.ignore_eos = MAX_TOKENS, True
    r.kv_source.endpoint, r.kv_source.num_tokens = source, len(PROMPT) - 1
    r.kv_source.timeout_s = timeout_s
    backend.client.send(env, [PROMPT])


def final_of(backend, rid: str):
    while True:
        m = backend.client.recv(30)
        if m.kind == "step_output":
            for o in m.envelope.step_output.outputs:
                if o.request_id == rid and o.finish_reason:
                    return o
        assert m.kind != "error", m.envelope.error.message


def test_a_pulled_prefix_with_no_room_yet_waits_for_it_instead_of_recomputing(tmp_path):
    """The receiver's blocks are held by a running request when the pulled blocks arrive (the
    H200 split, 2026-12-04 night: 4 of 12 long prompts recomputed on the decode backend, each a
    long prefill among its streams). Recomputing would need the same room, so the reply waits
    for it: the request is served from the pulled blocks once the other one ends, no failure."""
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me", num_blocks=20)   # PROMPT needs 12 of them
    try:
        want, _, _ = peer.run("warm")
        flag = slow_steps(me, 0.05)
        flag.set()
        occupy(me, "busy", 160, max_tokens=12)     # 10 blocks, 11 by its end: < 12 left
        next_step_output(me)
        send_pulled(me, "r", peer.worker.kv_server.endpoint, timeout_s=20)
        final = final_of(me, "r")
        flag.clear()
        assert final.num_cached_tokens == 192      # landed: nothing recomputed
        rep, puller = me.report(), me.worker.puller
        assert (rep.num_kv_pulls, rep.num_kv_pull_failures, rep.num_kv_pulled_tokens) == (1, 0, 192)
        assert puller.num_room_waits == 1
        got, _, _ = me.run("again")                # its own blocks now: the peer's answer
        assert got == want
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_landed_blocks_are_held_until_their_request_is_allocated(tmp_path):
    """Between landing and its first step a pulled request may wait behind others; the blocks
    it pulled must not be evicted for them (the H200 split: 4 of 12 landed 8K prefixes were,
    and recomputed). Here every free block is taken and given back at the moment of admission:
    the request still hits all 12 pulled blocks, and no hold outlives it."""
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me", num_blocks=20)
    puller, seen = me.worker.puller, {}
    keep = puller.keep_hold

    def keep_then_squeeze(p):
        keep(p)
        bm = me.bm  # the worker's thread: it owns the block manager here
        seen["held"] = bm.num_read_held_blocks
        free = bm.num_free_blocks
        bm.allocate("hog", [256] + [(13 * i + 1) % 250 for i in range(free * BS - 1)])
        bm.free("hog")  # every unheld cached block was overwritten by the hog
    puller.keep_hold = keep_then_squeeze
    try:
        want, _, _ = peer.run("warm")
        got, final, _ = me.run("r", source=peer.worker.kv_server.endpoint, timeout_s=10)
        assert seen["held"] == 12
        assert final.num_cached_tokens == 192 and got == want
        assert puller.num_holds == 0
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_a_pulled_prefix_that_never_finds_room_recomputes_at_its_deadline(tmp_path):
    peer = Backend(tmp_path, "peer")
    me = Backend(tmp_path, "me", num_blocks=20)
    try:
        peer.run("warm")
        flag = slow_steps(me, 0.05)
        flag.set()
        occupy(me, "busy", 160, max_tokens=140)    # 19 blocks by its end, for ~7 s: past the deadline
        next_step_output(me)
        t0 = time.monotonic()
        send_pulled(me, "r", peer.worker.kv_server.endpoint, timeout_s=0.6)
        deadline = time.monotonic() + 10
        while me.report().num_kv_pull_failures == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        waited = time.monotonic() - t0
        puller = me.worker.puller
        assert puller.num_room_waits == 1 and 0.5 <= waited < 5
        assert "until the deadline" in puller.last_error and "sequences hold" in puller.last_error
        assert puller.num_parked == 0              # it left the park once, to recompute
        me.client.send(codec.make_abort(["busy"]))
        final = final_of(me, "r")
        flag.clear()
        assert final.num_cached_tokens == 0 and final.finish_reason == pb.RequestOutput.LENGTH
        for b in (peer, me):
            b.assert_no_leak()
    finally:
        me.close()
        peer.close()


def test_the_kv_socket_refuses_other_messages_and_keeps_serving(tmp_path):
    peer = Backend(tmp_path, "peer")
    try:
        peer.run("warm")
        c = DealerClient(peer.worker.kv_server.endpoint)
        c.sock.send_multipart([b"\xff\x00garbage"])
        assert c.recv(5).kind == "error"
        c.send(codec.make_health(1, 0.0))
        assert c.recv(5).kind == "error"
        c.send(make_pull_env(peer), [PROMPT])
        m = c.recv(5)
        assert m.kind == "kv_blocks" and m.envelope.kv_blocks.num_blocks == 12
        assert peer.worker.kv_server.num_bad == 2
        c.close()
        peer.assert_no_leak()
    finally:
        peer.close()


def make_pull_env(backend):
    from backend.kv.transfer import make_pull
    return make_pull(5, 0, backend.worker.puller.port.layout, 12)
