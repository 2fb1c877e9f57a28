"""Class queues: the gateway's waiting room, one queue per `QueueClass`.

Service order (what `ClassQueues.pop` / `take` hand out next, at time `now`):

1. **Aging first.** A class head that has waited longer than its class's `max_wait_s`
   (`now - arrival_time > max_wait_s[cls]`) is served ahead of every class above it. Among
   several aged heads the order is `(arrival_time, class, seq)`.
2. Otherwise strict class order: FAST, then NORMAL, then SLOW.
3. Within a class, the class queue's policy decides (`QueueConfig.policy`, chosen by name via
   `create_request_queue`): `"fifo"` (default) serves in push order; `"priority"` serves the
   lowest `priority` value first (vLLM's convention: lower = earlier, default 0), ties by
   `(arrival_time, seq)`. Under `"priority"` aging looks at the head the policy would serve next,
   so aging stops starvation across classes; within a class, priority may starve (as in vLLM).
   Under `"fifo"` `priority` is carried untouched (the backend's step scheduler may use it).

Requests whose `deadline` has passed while queued are never handed out: `pop`/`take` first move
them to an expired buffer that `take_expired(now)` drains (the gateway answers them with 504).

Complexities: push, remove-by-id, pop are O(1) (FIFO) or O(log n) (priority). The FIFO queue is an
`OrderedDict` keyed by request id — a C doubly linked list, so removing from the middle is exact
O(1) with no tombstones, and taking a whole class is one `list(values)` + `clear`. The expiry heap
and the priority heap use lazy deletion: an entry is live iff the queue still maps its id to that
very object *and* the object's `seq` equals the entry's seq (re-pushing an object gives it a new
seq, so stale entries can never resurrect it); the heaps are rebuilt when dead entries outnumber
live ones, which keeps every operation O(1) amortized on top of the heap cost.

Arrival order is push order: callers push in arrival order (the gateway stamps `arrival_time` when
it pushes). "Oldest" for a class means its earliest-pushed request still queued.
"""
from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Callable, Iterator, NamedTuple

from scheduler.classes import DEFAULT_CLASS_BOUNDS, QueueClass, classify

NUM_CLASSES = len(QueueClass)
_consume = deque(maxlen=0).extend  # run an iterator to its end at C speed
_request_id = attrgetter("request_id")
_num_prompt_tokens = attrgetter("num_prompt_tokens")


@dataclass(slots=True, eq=False)
class PendingRequest:
    """A request waiting in the gateway. Identity semantics (eq=False): two requests are never equal."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    arrival_time: float
    queue_class: QueueClass
    priority: int = 0  # lower is served earlier within its class under the "priority" policy
    deadline: float | None = None  # absolute time; past it the request expires instead of being sent
    payload: object = None  # the caller's own data, carried untouched
    seq: int = field(default=-1, repr=False)  # assigned on push; strictly increasing; tie-breaker


class PushResult(NamedTuple):
    accepted: bool
    reason: str | None = None  # "queue_full" | "too_many_prompt_tokens" (the gateway answers 429)
    queue_class: QueueClass | None = None


ACCEPTED = PushResult(True)


@dataclass(frozen=True)
class QueueConfig:
    """Limits of the class queues. Tuples are indexed by `QueueClass`."""

    class_bounds: tuple[int, int] = DEFAULT_CLASS_BOUNDS
    # Aging bound per class, seconds. Set from the time each class spends being served: a Fast
    # request (<= 8 tokens) is done in tens of ms, so 50 ms of waiting already doubles its latency;
    # a Normal one runs for ~0.1-0.5 s; a Slow one (> 64 tokens) for seconds, where 1 s of waiting is
    # a modest share. Past its bound a request jumps the classes above it, so nothing starves.
    max_wait_s: tuple[float, float, float] = (0.05, 0.2, 1.0)
    # Caps per class: ~1 s of backlog at 8k req/s, and 4M prompt tokens (16 MiB of int32 ids) of
    # gateway memory. A push over a cap is refused (429 + Retry-After), never queued.
    max_requests: tuple[int, int, int] = (8192, 8192, 8192)
    max_prompt_tokens: tuple[int, int, int] = (1 << 22, 1 << 22, 1 << 22)
    policy: str = "fifo"  # within-class order, a name from REQUEST_QUEUES

    def __post_init__(self) -> None:
        fast_max, normal_max = self.class_bounds
        if not 0 <= fast_max < normal_max:
            raise ValueError(f"class_bounds must satisfy 0 <= fast < normal, got {self.class_bounds}")
        for name in ("max_wait_s", "max_requests", "max_prompt_tokens"):
            if len(getattr(self, name)) != NUM_CLASSES:
                raise ValueError(f"{name} needs one value per class ({NUM_CLASSES})")
        if not all(math.isfinite(w) and w >= 0 for w in self.max_wait_s):
            raise ValueError(f"max_wait_s must be finite and >= 0, got {self.max_wait_s}")
        if not all(isinstance(n, int) and n >= 1 for n in self.max_requests + self.max_prompt_tokens):
            raise ValueError("max_requests and max_prompt_tokens must be integers >= 1")
        if self.policy not in REQUEST_QUEUES:
            raise ValueError(f"unknown queue policy {self.policy!r}; known: {sorted(REQUEST_QUEUES)}")

    def classify(self, remaining_tokens: int) -> QueueClass:
        return classify(remaining_tokens, self.class_bounds)


class RequestQueue(ABC):
    """One class's waiting requests, kept in the order its policy serves them."""

    @abstractmethod
    def push(self, req: PendingRequest) -> None: ...
    @abstractmethod
    def peek(self) -> PendingRequest | None:
        """The request `pop` would return, or None."""
    @abstractmethod
    def pop(self) -> PendingRequest | None: ...
    @abstractmethod
    def take(self, n: int) -> list[PendingRequest]:
        """Up to n requests in service order."""
    @abstractmethod
    def remove(self, request_id: str) -> PendingRequest | None: ...
    @abstractmethod
    def get(self, request_id: str) -> PendingRequest | None: ...
    @abstractmethod
    def oldest_arrival(self) -> float | None:
        """Arrival time of the earliest-pushed request still queued."""
    @abstractmethod
    def __len__(self) -> int: ...
    @abstractmethod
    def __iter__(self) -> Iterator[PendingRequest]:
        """Queued requests in push order."""


class FifoRequestQueue(RequestQueue):
    """Push order. An OrderedDict id -> request: O(1) push, pop, remove from anywhere."""

    __slots__ = ("_od",)

    def __init__(self) -> None:
        self._od: OrderedDict[str, PendingRequest] = OrderedDict()

    def push(self, req: PendingRequest) -> None:
        self._od[req.request_id] = req

    def peek(self) -> PendingRequest | None:
        od = self._od
        return od[next(iter(od))] if od else None

    def pop(self) -> PendingRequest | None:
        return self._od.popitem(last=False)[1] if self._od else None

    def take(self, n: int) -> list[PendingRequest]:
        od = self._od
        if n >= len(od):  # the common case under load: the whole class leaves in one batch
            out = list(od.values())
            od.clear()
            return out
        popitem = od.popitem
        return [popitem(False)[1] for _ in range(n)]

    def remove(self, request_id: str) -> PendingRequest | None:
        return self._od.pop(request_id, None)

    def get(self, request_id: str) -> PendingRequest | None:
        return self._od.get(request_id)

    def oldest_arrival(self) -> float | None:
        od = self._od
        return od[next(iter(od))].arrival_time if od else None

    def __len__(self) -> int:
        return len(self._od)

    def __iter__(self) -> Iterator[PendingRequest]:
        return iter(list(self._od.values()))


class PriorityRequestQueue(RequestQueue):
    """Lowest `priority` first, ties by (arrival_time, seq). Heap with lazy deletion."""

    __slots__ = ("_od", "_heap")

    def __init__(self) -> None:
        self._od: OrderedDict[str, PendingRequest] = OrderedDict()  # membership, push order
        self._heap: list[tuple[int, float, int, PendingRequest]] = []

    def _live(self, entry: tuple[int, float, int, PendingRequest]) -> bool:
        req = entry[3]
        return req.seq == entry[2] and self._od.get(req.request_id) is req

    def _prune(self) -> None:
        heap = self._heap
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)

    def push(self, req: PendingRequest) -> None:
        self._od[req.request_id] = req
        heapq.heappush(self._heap, (req.priority, req.arrival_time, req.seq, req))

    def peek(self) -> PendingRequest | None:
        self._prune()
        return self._heap[0][3] if self._heap else None

    def pop(self) -> PendingRequest | None:
        self._prune()
        if not self._heap:
            return None
        req = heapq.heappop(self._heap)[3]
        del self._od[req.request_id]
        return req

    def take(self, n: int) -> list[PendingRequest]:
        out = []
        while len(out) < n and self._od:
            out.append(self.pop())
        return out

    def remove(self, request_id: str) -> PendingRequest | None:
        req = self._od.pop(request_id, None)
        if req is not None and len(self._heap) > 2 * len(self._od) + 16:
            self._heap = [e for e in self._heap if self._live(e)]  # O(n), paid for by n removals
            heapq.heapify(self._heap)
        return req

    def get(self, request_id: str) -> PendingRequest | None:
        return self._od.get(request_id)

    def oldest_arrival(self) -> float | None:
        od = self._od
        return od[next(iter(od))].arrival_time if od else None

    def __len__(self) -> int:
        return len(self._od)

    def __iter__(self) -> Iterator[PendingRequest]:
        return iter(list(self._od.values()))


REQUEST_QUEUES: dict[str, Callable[[], RequestQueue]] = {
    "fifo": FifoRequestQueue,
    "priority": PriorityRequestQueue,
}


def create_request_queue(name: str) -> RequestQueue:
    try:
        return REQUEST_QUEUES[name]()
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r}; known: {sorted(REQUEST_QUEUES)}") from None


class ClassQueues:
    """FAST / NORMAL / SLOW queues with caps, aging, cancellation and deadlines (see module doc)."""

    __slots__ = ("config", "size", "expiry_heap", "_queues", "_push_fns", "_index", "_counts", "_tokens",
                 "_max_requests", "_max_tokens", "_next_seq", "_expired")

    def __init__(self, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self.size = 0  # total queued; read-only outside this class
        self._queues = tuple(create_request_queue(self.config.policy) for _ in QueueClass)
        self._push_fns = tuple(q.push for q in self._queues)
        self._index: dict[str, PendingRequest] = {}  # every queued request by id: dedup, routing
        self._counts = [0] * NUM_CLASSES
        self._tokens = [0] * NUM_CLASSES
        self._max_requests = self.config.max_requests
        self._max_tokens = self.config.max_prompt_tokens
        self._next_seq = 0
        # (deadline, seq, req) min-heap of requests pushed with a deadline; entries of requests that
        # already left stay until popped or compacted. Read-only outside (the batcher peeks [0]).
        self.expiry_heap: list[tuple[float, int, PendingRequest]] = []
        self._expired: list[PendingRequest] = []  # taken out by pop/take, waiting for take_expired

    # -- admission ---------------------------------------------------------------------------
    def push(self, req: PendingRequest, now: float) -> PushResult:
        """Queue `req`, or refuse it when its class is at a cap (expired requests are purged first)."""
        cls = req.queue_class
        tokens = self._tokens
        num_tokens = tokens[cls] + req.num_prompt_tokens
        if self._counts[cls] >= self._max_requests[cls] or num_tokens > self._max_tokens[cls]:
            refusal = self._refusal(req, now)
            if refusal is not None:
                return refusal
            num_tokens = tokens[cls] + req.num_prompt_tokens
        index = self._index
        request_id = req.request_id
        if request_id in index:
            raise ValueError(f"request id {request_id!r} is already queued")
        index[request_id] = req
        req.seq = seq = self._next_seq
        self._next_seq = seq + 1
        self._push_fns[cls](req)
        self._counts[cls] += 1
        tokens[cls] = num_tokens
        self.size += 1
        if req.deadline is not None:
            self._push_deadline(req)
        return ACCEPTED

    def _refusal(self, req: PendingRequest, now: float) -> PushResult | None:
        cls = req.queue_class
        self.collect_expired(now)  # a full queue of dead requests must not refuse live ones
        if self._counts[cls] >= self._max_requests[cls]:
            return PushResult(False, "queue_full", QueueClass(cls))
        if self._tokens[cls] + req.num_prompt_tokens > self._max_tokens[cls]:
            return PushResult(False, "too_many_prompt_tokens", QueueClass(cls))
        return None

    def _push_deadline(self, req: PendingRequest) -> None:
        expiry = self.expiry_heap
        heapq.heappush(expiry, (req.deadline, req.seq, req))
        if len(expiry) > 2 * self.size + 1024:  # served requests leave stale entries behind
            self.expiry_heap = [e for e in expiry if self._is_queued(e[2], e[1])]
            heapq.heapify(self.expiry_heap)

    # -- removal -----------------------------------------------------------------------------
    def _is_queued(self, req: PendingRequest, seq: int) -> bool:
        return req.seq == seq and self._index.get(req.request_id) is req

    def _forget(self, req: PendingRequest) -> None:
        del self._index[req.request_id]
        cls = req.queue_class
        self._counts[cls] -= 1
        self._tokens[cls] -= req.num_prompt_tokens
        self.size -= 1

    def remove(self, request_id: str) -> PendingRequest | None:
        """Take a request out by id (cancellation). O(1); None when it is not queued."""
        req = self._index.get(request_id)
        if req is not None:
            self._queues[req.queue_class].remove(request_id)
            self._forget(req)
        return req

    def collect_expired(self, now: float) -> int:
        """Move requests whose deadline passed (deadline <= now) to the expired buffer; count moved."""
        moved = 0
        expiry = self.expiry_heap
        while expiry and expiry[0][0] <= now:
            _, seq, req = heapq.heappop(expiry)
            if self._is_queued(req, seq):
                self._queues[req.queue_class].remove(req.request_id)
                self._forget(req)
                self._expired.append(req)
                moved += 1
        return moved

    def take_expired(self, now: float) -> list[PendingRequest]:
        """Requests whose deadline passed (deadline <= now) while queued, in deadline order."""
        self.collect_expired(now)
        out, self._expired = self._expired, []
        return out

    def next_expiry(self) -> float | None:
        """Earliest deadline among queued requests (may be a stale, earlier one: harmless)."""
        return self.expiry_heap[0][0] if self.expiry_heap else None

    # -- service -----------------------------------------------------------------------------
    def pop(self, now: float) -> PendingRequest | None:
        out = self.take(1, now)
        return out[0] if out else None

    def take(self, n: int, now: float) -> list[PendingRequest]:
        """Up to n requests in service order (aging, then class order, then the class policy)."""
        if self.expiry_heap and self.expiry_heap[0][0] <= now:
            self.collect_expired(now)
        out: list[PendingRequest] = []
        queues = self._queues
        index = self._index
        max_wait = self.config.max_wait_s
        while n > 0 and self.size:
            top = -1
            aged = -1  # the aged head with the least (arrival_time, class, seq)
            num_aged = 0
            for cls in range(NUM_CLASSES):
                if self._counts[cls]:
                    head = queues[cls].peek()
                    if top < 0:
                        top = cls
                    if now - head.arrival_time > max_wait[cls]:
                        num_aged += 1
                        if aged < 0 or head.arrival_time < best.arrival_time:  # classes scanned in order
                            aged, best = cls, head
            if num_aged == 0 or (num_aged == 1 and aged == top):
                # no other class is aged, so order cannot change during a run from `top`
                got = queues[top].take(n)
                out += got
                k = len(got)
                _consume(map(index.__delitem__, map(_request_id, got)))
                self._counts[top] -= k
                self._tokens[top] = (0 if not self._counts[top]
                                     else self._tokens[top] - sum(map(_num_prompt_tokens, got)))
                self.size -= k
                n -= k
            else:
                req = queues[aged].pop()
                self._forget(req)
                out.append(req)
                n -= 1
        return out

    # -- inspection --------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.size

    def get(self, request_id: str) -> PendingRequest | None:
        return self._index.get(request_id)

    def depth(self, cls: QueueClass) -> int:
        return self._counts[cls]

    def num_prompt_tokens(self, cls: QueueClass) -> int:
        return self._tokens[cls]

    def oldest_arrival(self, cls: QueueClass | None = None) -> float | None:
        """Earliest arrival still queued, in `cls` or over all classes."""
        if cls is not None:
            return self._queues[cls].oldest_arrival()
        times = [t for q in self._queues if (t := q.oldest_arrival()) is not None]
        return min(times) if times else None

    def __iter__(self) -> Iterator[PendingRequest]:
        """Everything queued, class by class in push order (not service order)."""
        for q in self._queues:
            yield from q
