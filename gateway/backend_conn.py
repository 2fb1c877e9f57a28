"""One backend as the gateway's pool holds it: its ZMQ DEALER (`BackendConn`), what it told us,
and the requests it holds for us (`Dispatch` per request, whose outputs go to a `RequestSink`).
`gateway.http_backend.HttpBackendConn` stands in the same place for an HTTP server."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio

from gateway.errors import APIError, backend_error, deadline_exceeded, unavailable
from gateway.zmqio import SocketReader
from proto import codec
from proto import tidegate_pb2 as pb
from proto.security import CurveKeys

# (sampled token's logprob, top candidate ids, their logprobs)
TokenLogprob = tuple[float, list[int], list[float]]



class RequestSink(Protocol):
    """Where a request's outputs go (implemented by `gateway.core.RequestHandle`)."""

    def on_tokens(self, token_ids: list[int], finish_reason: str | None,
                  logprobs: list[TokenLogprob] | None, now: float,
                  text: str | None = None) -> None: ...  # text: see RequestOutput.text

    def on_error(self, error: APIError) -> None: ...

    # Optional (looked up with getattr): the backend's cumulative speculation counters for the
    # request (RequestOutput fields 9-12), called before `on_tokens` of the same output when
    # any of them is non-zero:
    # def on_speculation(self, draft_tokens, accepted_draft_tokens, accepted_prediction,
    #                    rejected_prediction) -> None: ...



@dataclass(slots=True)
class Dispatch:
    """One request on its way to a backend."""

    request_id: str
    prompt_ids: list[int]
    sampling: pb.SamplingParams
    queue_class: int
    priority: int
    arrival_time: float
    sink: RequestSink
    retried: bool = False  # re-dispatched once already after its backend died
    batch_id: int = 0  # the Batch that carried it to its backend (an Error may name it)
    # tokens of this request still charged to its backend's load (scheduler.placement), all
    # released when it ends
    charged_left: int = 0
    prediction_ids: list[int] | None = None  # Predicted Outputs: a raw int32 frame on the wire
    speculation: pb.SpeculationParams | None = None  # per-request control; None: the default
    session: object = None  # scheduler.sessions.SessionInfo it was placed with (None: none)
    kv_source: object = None  # pb.KvSource: pull its prefix from this peer (gateway.kv_pull)
    # its TTFT deadline (arrival_time + its TTFT target, the same clock; 0: none), sent with
    # `tidegate serve --deadline-order` (GenerateRequest.deadline; scheduler.deadline_order)
    deadline: float = 0.0


def error_from_backend(err: pb.Error) -> APIError:
    if err.code == pb.Error.INVALID_REQUEST:
        return APIError(400, f"Backend refused the request: {err.message}", code="invalid_request")
    if err.code == pb.Error.DEADLINE:
        return deadline_exceeded(f"Backend: {err.message}")
    if err.code in (pb.Error.CAPACITY, pb.Error.SHUTTING_DOWN):
        return unavailable(f"Backend unavailable: {err.message}")
    return backend_error(f"Backend error: {err.message}")


class BackendConn:
    """One backend: its socket, what it told us, and the requests it holds for us."""

    def __init__(self, address: str, ctx: zmq.asyncio.Context,
                 curve: CurveKeys | None = None) -> None:
        self.address = address
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # BackendInfo carries the tokenizer (MBs); anything past the codec's frame limit is
        # refused by libzmq before it is buffered.
        self.sock.setsockopt(zmq.MAXMSGSIZE, codec.MAX_FRAME_BYTES)
        if curve is not None and address.startswith("tcp://"):
            curve.apply_client(self.sock)
        self.sock.connect(address)
        self.io = SocketReader(self.sock, self._no_handler)  # the pool sets the handler
        self.info: pb.BackendInfo | None = None
        self.load = pb.LoadReport()
        self.healthy = False
        self.last_seen = 0.0
        self.last_hello = 0.0
        self.inflight: dict[str, tuple[Dispatch, int]] = {}  # id -> (dispatch, tokens so far)
        self.pid = -1                   # this backend's id in the placement policy
        self.placement = None           # the pool's policy (reads this backend's load)
        self.draining = False           # takes no new requests; leaves when its last one ends

    @property
    def num_inflight(self) -> int:
        return len(self.inflight)

    @property
    def outstanding_tokens(self) -> int:
        """Tokens still to process for us here: prompts not yet prefilled (less what the policy
        expects cached) and outputs not yet generated."""
        return self.placement.load(self.pid) if self.placement is not None else 0

    @property
    def kv_cache_usage(self) -> float:
        total = self.load.num_total_blocks
        return 1.0 - self.load.num_free_blocks / total if total else 0.0

    @staticmethod
    def _no_handler(frames) -> None:
        pass

    def send(self, envelope: pb.Envelope, arrays: Iterable = ()) -> bool:
        """Queue one message without waiting; False if the socket would block or is closed."""
        return self.io.send(codec.encode_trusted(envelope, arrays))

