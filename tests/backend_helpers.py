"""Helpers for the backend tests: tiny random HF LLaMA checkpoints and a hand-driven runner."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenizer.byte_level import byte_level_bundle

# name -> LlamaConfig kwargs. GQA ratios 1, 4, 7; linear rope x4; odd vocab; tied / untied.
CHECKPOINTS = {
    "gqa1_untied_oddvocab": {"vocab_size": 263, "hidden_size": 64, "intermediate_size": 96,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                                 "tie_word_embeddings": False},
    "gqa4_tied_rope4": {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                            "head_dim": 16, "tie_word_embeddings": True,
                            "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "gqa7_sharded": {"vocab_size": 261, "hidden_size": 112, "intermediate_size": 160,
                         "num_hidden_layers": 3, "num_attention_heads": 7, "num_key_value_heads": 1,
                         "head_dim": 16, "tie_word_embeddings": False, "rope_theta": 100000.0,
                         "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
}


def make_checkpoint(root: Path, name: str, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(CHECKPOINTS[name])
    rope_scaling = kw.pop("rope_scaling", None)
    theta = kw.pop("rope_theta", 10000.0)
    cfg = LlamaConfig(max_position_embeddings=512, initializer_range=0.08, bos_token_id=256,
                      eos_token_id=257, rope_theta=theta, rope_scaling=rope_scaling, **kw)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    path = root / name
    shard = "40KB" if "sharded" in name else "1GB"
    model.save_pretrained(path, max_shard_size=shard)
    bundle = byte_level_bundle()
    (path / "tokenizer.json").write_text(bundle.tokenizer_json)
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "chat_template": bundle.chat_template}))
    return path


def hf_model(path: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@dataclass
class Chunk:
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    is_prefill: bool = True
    sample: bool = True


@dataclass
class BlockAllocator:
    """Trivial contiguous allocation for hand-driven runner tests."""
    block_size: int
    next_block: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)

    def table(self, rid: str, num_tokens: int) -> list[int]:
        t = self.tables.setdefault(rid, [])
        while len(t) * self.block_size < num_tokens:
            t.append(self.next_block)
            self.next_block += 1
        return list(t)


# ---- a worker subprocess and a DEALER client -------------------------------------------------

class WorkerProcess:
    """`tidegate backend ...` in a subprocess, ready when it prints its ready line."""

    def __init__(self, args: list[str], endpoint: str, timeout: float = 60.0) -> None:
        import subprocess
        import sys
        import time

        self.endpoint = endpoint
        cmd = [sys.executable, "-m", "gateway.tidegate_cli", "backend", "--listen", endpoint, *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()
        if "ready" not in line or time.monotonic() > deadline:
            self.proc.kill()
            raise RuntimeError(f"worker did not start: {line!r} {self.proc.stderr.read()}")
        self.ready_line = line

    def terminate(self, timeout: float = 30.0) -> int:
        import signal

        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class DealerClient:
    def __init__(self, endpoint: str) -> None:
        import zmq

        self.zmq = zmq
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.load_reports = []
        self.errors = []
        self.logprobs = {}  # request id -> [TokenLogprobs] over all outputs seen

    def send(self, envelope, arrays=()) -> None:
        from proto import codec

        self.sock.send_multipart(codec.encode(envelope, arrays))

    def recv(self, timeout_s: float = 30.0):
        from proto import codec

        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError("no message from the worker")
        return codec.decode(self.sock.recv_multipart())

    def hello(self):
        from proto import codec
        from proto import tidegate_pb2 as pb

        self.send(codec.make_hello("test", pb.Hello.GATEWAY))
        while True:
            m = self.recv()
            if m.kind == "backend_info":
                return m.envelope.backend_info

    def batch(self, requests: dict, **sampling) -> None:
        """requests: id -> prompt ids; same sampling for all."""
        from proto import tidegate_pb2 as pb

        env = pb.Envelope(batch=pb.Batch())
        arrays = []
        for rid, prompt in requests.items():
            r = env.batch.requests.add(request_id=rid, prompt_frame=len(arrays))
            arrays.append(prompt)
            for k, v in sampling.items():
                if k == "stop_token_ids":
                    r.sampling.stop_token_ids.extend(v)
                else:
                    setattr(r.sampling, k, v)
        self.send(env, arrays)

    def collect(self, request_ids, timeout_s: float = 120.0):
        """Read until every id finished (or errored). Returns (tokens, finals, step outputs seen)."""
        import time

        pending = set(request_ids)
        tokens = {rid: [] for rid in request_ids}
        finals = {}
        num_step_outputs = 0
        deadline = time.monotonic() + timeout_s
        while pending:
            m = self.recv(max(0.1, deadline - time.monotonic()))
            if m.kind == "load_report":
                self.load_reports.append((time.monotonic(), m.envelope.load_report))
            elif m.kind == "error":
                self.errors.append(m.envelope.error)
                pending.discard(m.envelope.error.request_id)
            elif m.kind == "step_output":
                num_step_outputs += 1
                for o in m.envelope.step_output.outputs:
                    self.logprobs.setdefault(o.request_id, []).extend(o.logprobs)
                    if o.tokens_frame >= 0:
                        tokens[o.request_id].extend(m.arrays[o.tokens_frame].tolist())
                    if o.finish_reason:
                        finals[o.request_id] = o
                        pending.discard(o.request_id)
        return tokens, finals, num_step_outputs

    def close(self) -> None:
        self.sock.close()


def hf_greedy(hf, prompt: list[int], num_new: int) -> list[int]:
    """transformers' greedy generation (KV cache on, EOS off): the reference token stream."""
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=num_new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()
