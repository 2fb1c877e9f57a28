"""Between the wire enums and the strings the Python side uses, written once for the gateway,
its client front door and the backend worker. protobuf only (proto/ imports nothing of ours).

Sampling parameters have their own module, `proto.sampling` (the one record both sides hold,
its check and its wire conversion).
"""
from __future__ import annotations

from proto import tidegate_pb2 as pb

# OpenAI finish_reason (None: still running) -> RequestOutput.FinishReason
FINISH_REASON_TO_WIRE: dict[str | None, int] = {
    None: pb.RequestOutput.NONE,
    "stop": pb.RequestOutput.STOP,
    "length": pb.RequestOutput.LENGTH,
    "abort": pb.RequestOutput.ABORT,
}
# RequestOutput.FinishReason -> OpenAI finish_reason; NONE, ERROR (an error, not a finish) and
# unknown values are absent
FINISH_REASON_FROM_WIRE: dict[int, str] = {
    wire: reason for reason, wire in FINISH_REASON_TO_WIRE.items() if reason is not None}
