"""A fake backend for the gateway tests: a ZMQ ROUTER that speaks the real protocol.

It answers Hello with a BackendInfo carrying the real byte-level tokenizer, runs "steps" that
emit one scripted token per running request, sends LoadReports, honours Abort, and keeps a
fake KV-block ledger (blocks taken on admission, returned on finish or abort) so tests can
assert that nothing leaks. Run as a script it serves on an address until killed:

    python tests/test_gateway_fakes.py ipc:///tmp/x.sock
"""
from __future__ import annotations

import asyncio
import math
import sys
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from proto import codec
from proto import tidegate_pb2 as pb
from tokenizer.byte_level import SIMPLE_CHAT_TEMPLATE, build_byte_level_tokenizer_json

EOS = 257
DEFAULT_TEXT = "Hello, wörld! €5 😀 done."
_TOKENIZER_JSON: str | None = None


def tokenizer_json() -> str:
    global _TOKENIZER_JSON
    if _TOKENIZER_JSON is None:
        _TOKENIZER_JSON = build_byte_level_tokenizer_json()
    return _TOKENIZER_JSON


def default_script(prompt_ids: list[int], sampling: pb.SamplingParams) -> list[int]:
    """The default completion: DEFAULT_TEXT's bytes, then EOS."""
    return list(DEFAULT_TEXT.encode()) + [EOS]


@dataclass
class FakeRequest:
    peer: bytes
    request_id: str
    prompt_len: int
    script: list[int]
    max_tokens: int
    ignore_eos: bool
    num_blocks: int
    num_logprobs: int = 0
    pos: int = 0


@dataclass
class FakeBackend:
    address: str
    model: str = "tiny"
    max_model_len: int = 2048
    step_s: float = 0.002
    report_s: float = 0.05
    num_total_blocks: int = 4096
    block_size: int = 16
    script: object = default_script
    received: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    batch_ids: list[int] = field(default_factory=list)  # Batch.batch_id of each Batch
    aborted: list[str] = field(default_factory=list)
    num_bad_messages: int = 0
    running: dict = field(default_factory=dict)
    report_extra: dict = field(default_factory=dict)  # more LoadReport fields to send
    info_extra: dict = field(default_factory=dict)    # more BackendInfo fields to send
    prefix_hashes: list = field(default_factory=list)  # reported as held (LoadReport facts)

    def __post_init__(self) -> None:
        self.num_free_blocks = self.num_total_blocks
        self.go = asyncio.Event()  # cleared: steps pause (requests stay in flight)
        self.go.set()
        self.reporting = True  # False: no LoadReports, no pongs (a hung process, as seen)
        self._peers: set[bytes] = set()
        self._tasks: list[asyncio.Task] = []
        self._step = 0

    async def start(self) -> FakeBackend:
        self._ctx = zmq.asyncio.Context()
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.address)
        self._tasks = [asyncio.create_task(self._recv_loop()), asyncio.create_task(self._steps()),
                       asyncio.create_task(self._reports())]
        return self

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.sock.close(linger=0)
        self._ctx.destroy(linger=0)

    def _send(self, peer: bytes, env: pb.Envelope, arrays=()) -> None:
        self.sock.send_multipart([peer, *codec.encode(env, arrays)])

    def info(self) -> pb.BackendInfo:
        return pb.BackendInfo(
            protocol_version=codec.PROTOCOL_VERSION, model=self.model,
            max_model_len=self.max_model_len, vocab_size=259, block_size=self.block_size,
            num_kv_blocks=self.num_total_blocks, tokenizer_json=tokenizer_json(),
            chat_template=SIMPLE_CHAT_TEMPLATE, bos_token_id=256, eos_token_ids=[EOS],
            backend_id=f"fake-{self.address}", **self.info_extra)

    async def _recv_loop(self) -> None:
        while True:
            peer, *frames = await self.sock.recv_multipart()
            try:
                decoded = codec.decode(frames)
            except codec.DecodeError as exc:
                self.num_bad_messages += 1
                self._send(peer, codec.error_for(exc))
                continue
            env = decoded.envelope
            if decoded.kind == "hello":
                self._peers.add(peer)
                self._send(peer, pb.Envelope(backend_info=self.info()))
            elif decoded.kind == "batch":
                self.batch_sizes.append(len(env.batch.requests))
                self.batch_ids.append(env.batch.batch_id)
                for r in env.batch.requests:
                    self._admit(peer, r, codec.array_of(decoded, r.prompt_frame))
            elif decoded.kind == "abort":
                for rid in env.abort.request_ids:
                    req = self.running.pop(rid, None)
                    if req is not None:
                        self.aborted.append(rid)
                        self.num_free_blocks += req.num_blocks
            elif decoded.kind == "health" and not env.health.reply and self.reporting:
                self._send(peer, codec.make_health(env.health.nonce, 0.0, reply=True))

    def _admit(self, peer: bytes, r: pb.GenerateRequest, prompt) -> None:
        self.received.append(r.request_id)
        prompt_ids = [] if prompt is None else prompt.tolist()
        blocks = math.ceil((len(prompt_ids) + r.sampling.max_tokens) / self.block_size)
        self.num_free_blocks -= blocks
        self.running[r.request_id] = FakeRequest(
            peer, r.request_id, len(prompt_ids), list(self.script(prompt_ids, r.sampling)),
            r.sampling.max_tokens, r.sampling.ignore_eos, blocks, r.sampling.logprobs)

    async def _steps(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            await self.go.wait()
            if self.running:
                self._one_step()

    def _one_step(self) -> None:
        self._step += 1
        per_peer: dict[bytes, tuple[pb.StepOutput, list]] = {}
        for rid, req in list(self.running.items()):
            step, arrays = per_peer.setdefault(req.peer, (pb.StepOutput(step=self._step), []))
            token = req.script[req.pos % len(req.script)]
            if token == EOS and req.ignore_eos:
                token = ord(" ")
            req.pos += 1
            finish = pb.RequestOutput.NONE
            if token == EOS:
                finish = pb.RequestOutput.STOP
            elif req.pos >= req.max_tokens:
                finish = pb.RequestOutput.LENGTH
            out = step.outputs.add(request_id=rid, tokens_frame=len(arrays),
                                   finish_reason=finish, num_prompt_tokens=req.prompt_len,
                                   num_completion_tokens=req.pos)
            if req.num_logprobs:  # scripted: the sampled token at -0.5, then its neighbours
                top = [token, (token + 1) % 256, (token + 2) % 256][:req.num_logprobs]
                out.logprobs.add(logprob=-0.5, top_ids=top,
                                 top_logprobs=[-0.5, -2.0, -3.0][:len(top)])
            arrays.append([token])
            if finish != pb.RequestOutput.NONE:
                del self.running[rid]
                self.num_free_blocks += req.num_blocks
        for peer, (step, arrays) in per_peer.items():
            self._send(peer, pb.Envelope(step_output=step), arrays)

    async def _reports(self) -> None:
        while True:
            await asyncio.sleep(self.report_s)
            if not self.reporting:
                continue
            report = pb.LoadReport(
                num_running=len(self.running), num_waiting=0, num_free_blocks=self.num_free_blocks,
                num_total_blocks=self.num_total_blocks, backend_id=f"fake-{self.address}",
                num_outstanding_tokens=sum(r.max_tokens - r.pos for r in self.running.values()),
                **self.report_extra)
            if self.prefix_hashes:
                report.prefix_hashes.extend(self.prefix_hashes)
                report.prefix_block_size = self.block_size
            for peer in self._peers:
                self._send(peer, pb.Envelope(load_report=report))


async def _serve_forever(address: str) -> None:
    backend = await FakeBackend(address).start()
    print(f"fake backend on {address}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await backend.stop()


if __name__ == "__main__":
    asyncio.run(_serve_forever(sys.argv[1]))
