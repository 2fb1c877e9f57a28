"""tidegate's policy core: pure Python, no clock reads, no torch/asyncio/zmq/sockets.

Import submodules directly (``from scheduler.batcher import DynamicWindowBatcher``); this
package file stays import-light on purpose.
"""
from scheduler.classes import DEFAULT_CLASS_BOUNDS, QueueClass, classify
from scheduler.clock import Clock, ManualClock, WallClock

__all__ = ["DEFAULT_CLASS_BOUNDS", "Clock", "ManualClock", "QueueClass", "WallClock", "classify"]
