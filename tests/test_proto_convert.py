"""proto.convert: the one map between wire enums and the Python side's strings."""
from proto import tidegate_pb2 as pb
from proto.convert import FINISH_REASON_FROM_WIRE, FINISH_REASON_TO_WIRE
from scheduler.classes import CLASS_NAMES


def test_finish_reasons_cover_the_wire_enum_both_ways():
    wire = pb.RequestOutput.FinishReason
    # ERROR is no finish_reason: the gateway turns it into an error response (backend_pool)
    assert set(FINISH_REASON_TO_WIRE.values()) == set(wire.values()) - {pb.RequestOutput.ERROR}
    assert pb.RequestOutput.ERROR not in FINISH_REASON_FROM_WIRE
    assert FINISH_REASON_TO_WIRE[None] == pb.RequestOutput.NONE
    for reason, value in FINISH_REASON_TO_WIRE.items():
        assert FINISH_REASON_FROM_WIRE.get(value) == reason
        assert reason is None or wire.Name(value).lower() == reason


def test_queue_class_names_match_the_wire_enum():
    # the gateway labels metrics and 429s with scheduler.classes.CLASS_NAMES; the wire carries
    # the QueueClass enum: value i must be named CLASS_NAMES[i] on both sides
    assert tuple(pb.QueueClass.Name(v).lower() for v in sorted(pb.QueueClass.values())) == CLASS_NAMES
