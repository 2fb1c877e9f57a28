"""tidegate's policy core: pure Python, no clock reads, no torch/asyncio/zmq/sockets.

Import submodules directly (``from scheduler.batcher import DynamicWindowBatcher``); this
package file stays import-light on purpose.
"""
from scheduler.classes import CLASS_NAMES, DEFAULT_CLASS_BOUNDS, QueueClass, class_index, classify
from scheduler.clock import Clock, ManualClock, WallClock

__all__ = ["CLASS_NAMES", "DEFAULT_CLASS_BOUNDS", "Clock", "ManualClock", "QueueClass", "WallClock",
           "class_index", "classify"]
