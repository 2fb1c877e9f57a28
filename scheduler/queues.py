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

Complexities: push, remove-by-id and pop are O(1) (FIFO) or O(log n) (priority). `ClassQueues`
keeps one dict id -> request (dedup, cancellation); each FIFO class queue is an `OrderedDict` keyed
by the request object — a C doubly linked list, so removal from the middle is exact O(1) with no
tombstones, and a batch that empties a class is one `list(od)` + `clear()`. The expiry heap and the
priority heap use lazy deletion: an entry is live iff the request is still queued *and* its `seq`
equals the entry's seq (re-pushing an object gives it a new seq, so a stale entry can never
resurrect it); a heap is rebuilt when dead entries outnumber live ones (plus slack), which keeps
every operation O(1) amortized on top of the heap cost, and the expiry heap is simply cleared
whenever the queues become empty.

Arrival order is push order: callers push in arrival order (the gateway stamps `arrival_time` when
it pushes). "Oldest" for a class means its earliest-pushed request still queued.
"""
from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

from scheduler.classes import DEFAULT_CLASS_BOUNDS, QueueClass, classify

NUM_CLASSES = len(QueueClass)
_MISSING = object()
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
    """One class's waiting requests, kept in the order its policy serves them.

    `ClassQueues` owns the id index, caps and deadlines; a RequestQueue only orders. Requests are
    handed in and out as objects (identity, not id), and each is in at most one queue at a time.
    """

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
    def remove(self, req: PendingRequest) -> bool:
        """Take `req` out wherever it is; False when it is not here."""
    @abstractmethod
    def oldest_arrival(self) -> float | None:
        """Arrival time of the earliest-pushed request still queued."""
    @abstractmethod
    def __len__(self) -> int: ...
    @abstractmethod
    def __iter__(self) -> Iterator[PendingRequest]:
        """Queued requests in push order."""

    def push_fn(self) -> Callable[[PendingRequest], object]:
        """The callable ClassQueues caches for `push` (a queue may hand out a C-level one)."""
        return self.push


class FifoRequestQueue(RequestQueue):
    """Push order. An OrderedDict keyed by the request object (identity hash; value unused):
    a C doubly linked list, so push, pop and remove-from-anywhere are exact O(1)."""

    __slots__ = ("_od",)

    def __init__(self) -> None:
        self._od: OrderedDict[PendingRequest, None] = OrderedDict()

    def push(self, req: PendingRequest) -> None:
        self._od[req] = None

    def push_fn(self) -> Callable[[PendingRequest], object]:
        return self._od.setdefault  # od.setdefault(req) == od[req] = None, without a Python frame

    def peek(self) -> PendingRequest | None:
        return next(iter(self._od)) if self._od else None

    def pop(self) -> PendingRequest | None:
        return self._od.popitem(last=False)[0] if self._od else None

    def take(self, n: int) -> list[PendingRequest]:
        od = self._od
        if n >= len(od):  # the common case under load: the whole class leaves in one batch
            out = list(od)
            od.clear()
            return out
        popitem = od.popitem
        return [popitem(False)[0] for _ in range(n)]

    def remove(self, req: PendingRequest) -> bool:
        return self._od.pop(req, _MISSING) is not _MISSING

    def oldest_arrival(self) -> float | None:
        return next(iter(self._od)).arrival_time if self._od else None

    def __len__(self) -> int:
        return len(self._od)

    def __iter__(self) -> Iterator[PendingRequest]:
        return iter(list(self._od))


class PriorityRequestQueue(RequestQueue):
    """Lowest `priority` first, ties by (arrival_time, seq). A heap with lazy deletion beside an
    OrderedDict of members in push order (for `oldest_arrival` and O(1) removal)."""

    __slots__ = ("_heap", "_od")

    def __init__(self) -> None:
        self._od: OrderedDict[PendingRequest, None] = OrderedDict()
        self._heap: list[tuple[int, float, int, PendingRequest]] = []  # (priority, arrival, seq, req)

    def _live(self, entry: tuple[int, float, int, PendingRequest]) -> bool:
        req = entry[3]
        return req.seq == entry[2] and req in self._od

    def _prune(self) -> None:
        heap = self._heap
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)

    def push(self, req: PendingRequest) -> None:
        self._od[req] = None
        heapq.heappush(self._heap, (req.priority, req.arrival_time, req.seq, req))

    def peek(self) -> PendingRequest | None:
        self._prune()
        return self._heap[0][3] if self._heap else None

    def pop(self) -> PendingRequest | None:
        self._prune()
        if not self._heap:
            return None
        req = heapq.heappop(self._heap)[3]
        del self._od[req]
        return req

    def take(self, n: int) -> list[PendingRequest]:
        out = []
        while len(out) < n and self._od:
            out.append(self.pop())
        return out

    def remove(self, req: PendingRequest) -> bool:
        if self._od.pop(req, _MISSING) is _MISSING:
            return False
        if len(self._heap) > 2 * len(self._od) + 16:  # O(n) rebuild, paid for by n removals
            self._heap = [e for e in self._heap if self._live(e)]
            heapq.heapify(self._heap)
        return True

    def oldest_arrival(self) -> float | None:
        return next(iter(self._od)).arrival_time if self._od else None

    def __len__(self) -> int:
        return len(self._od)

    def __iter__(self) -> Iterator[PendingRequest]:
        return iter(list(self._od))


REQUEST_QUEUES: dict[str, Callable[[], RequestQueue]] = {
    "fifo": FifoRequestQueue,
    "priority": PriorityRequestQueue,
}


def create_request_queue(name: str) -> RequestQueue:
    try:
        return REQUEST_QUEUES[name]()
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r}; known: {sorted(REQUEST_QUEUES)}") from None


class _ClassState:
    """One class's queue, counters and limits together: one subscript per push, then slot reads."""

    __slots__ = ("count", "max_requests", "max_tokens", "max_wait", "push", "queue", "tokens")

    def __init__(self, queue: RequestQueue, max_requests: int, max_tokens: int, max_wait: float) -> None:
        self.queue = queue
        self.push = queue.push_fn()
        self.count = 0
        self.tokens = 0  # prompt tokens queued
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.max_wait = max_wait


class ClassQueues:
    """FAST / NORMAL / SLOW queues with caps, aging, cancellation and deadlines (see module doc)."""

    __slots__ = ("_classes", "_expired", "_index", "_next_seq", "config", "expiry_heap", "size")

    def __init__(self, config: QueueConfig | None = None) -> None:
        cfg = self.config = config or QueueConfig()
        self.size = 0  # total queued; read-only outside this class
        self._classes = tuple(
            _ClassState(create_request_queue(cfg.policy), cfg.max_requests[c], cfg.max_prompt_tokens[c],
                        cfg.max_wait_s[c]) for c in QueueClass)
        self._index: dict[str, PendingRequest] = {}  # every queued request by id: dedup, removal
        self._next_seq = 0
        # (deadline, seq, req) min-heap of requests pushed with a deadline; entries of requests that
        # already left stay until popped or compacted. Read-only outside (the batcher peeks [0]).
        self.expiry_heap: list[tuple[float, int, PendingRequest]] = []
        self._expired: list[PendingRequest] = []  # taken out by pop/take, waiting for take_expired

    # -- admission ---------------------------------------------------------------------------
    def push(self, req: PendingRequest, now: float) -> PushResult:
        """Queue `req`, or refuse it when its class is at a cap (expired requests are purged first).
        Raises ValueError if a request with the same id is already queued."""
        cs = self._classes[req.queue_class]
        num_tokens = cs.tokens + req.num_prompt_tokens
        if cs.count >= cs.max_requests or num_tokens > cs.max_tokens:
            refusal = self._refusal(req, now)
            if refusal is not None:
                return refusal
            num_tokens = cs.tokens + req.num_prompt_tokens
        index = self._index
        request_id = req.request_id
        if request_id in index:
            raise ValueError(f"request id {request_id!r} is already queued")
        index[request_id] = req
        req.seq = seq = self._next_seq
        self._next_seq = seq + 1
        cs.push(req)
        cs.count += 1
        cs.tokens = num_tokens
        self.size += 1
        if req.deadline is not None:
            self._push_deadline(req)
        return ACCEPTED

    def _refusal(self, req: PendingRequest, now: float) -> PushResult | None:
        cs = self._classes[req.queue_class]
        self.collect_expired(now)  # a full queue of dead requests must not refuse live ones
        if cs.count >= cs.max_requests:
            return PushResult(False, "queue_full", QueueClass(req.queue_class))
        if cs.tokens + req.num_prompt_tokens > cs.max_tokens:
            return PushResult(False, "too_many_prompt_tokens", QueueClass(req.queue_class))
        return None

    def _push_deadline(self, req: PendingRequest) -> None:
        expiry = self.expiry_heap
        heapq.heappush(expiry, (req.deadline, req.seq, req))
        if len(expiry) > 2 * self.size + 1024:  # served requests leave stale entries behind
            get = self._index.get
            self.expiry_heap = [e for e in expiry if e[2].seq == e[1] and get(e[2].request_id) is e[2]]
            heapq.heapify(self.expiry_heap)

    # -- removal -----------------------------------------------------------------------------
    def _is_queued(self, req: PendingRequest, seq: int) -> bool:
        return req.seq == seq and self._index.get(req.request_id) is req

    def _forget(self, req: PendingRequest) -> None:
        del self._index[req.request_id]
        cs = self._classes[req.queue_class]
        cs.count -= 1
        cs.tokens -= req.num_prompt_tokens
        self.size -= 1

    def remove(self, request_id: str) -> PendingRequest | None:
        """Take a request out by id (cancellation). O(1); None when it is not queued."""
        req = self._index.get(request_id)
        if req is not None:
            self._classes[req.queue_class].queue.remove(req)
            self._forget(req)
        return req

    def collect_expired(self, now: float) -> int:
        """Move requests whose deadline passed (deadline <= now) to the expired buffer; count moved."""
        moved = 0
        expiry = self.expiry_heap
        while expiry and expiry[0][0] <= now:
            _, seq, req = heapq.heappop(expiry)
            if self._is_queued(req, seq):
                self._classes[req.queue_class].queue.remove(req)
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
        if self.size == 1 and n > 0:  # one queued (an idle flush's window): no order to work out
            req = next(cs for cs in self._classes if cs.count).queue.pop()
            self._forget(req)
            self.expiry_heap.clear()  # nothing queued: every entry is stale
            return [req]
        out: list[PendingRequest] = []
        index = self._index
        while n > 0 and self.size:
            top = None  # the highest non-empty class
            aged = best = None  # the aged head with the least (arrival_time, class, seq)
            num_aged = 0
            for cs in self._classes:  # in class order
                if cs.count:
                    head = cs.queue.peek()
                    if top is None:
                        top = cs
                    if now - head.arrival_time > cs.max_wait:
                        num_aged += 1
                        if aged is None or head.arrival_time < best.arrival_time:
                            aged, best = cs, head
            if num_aged == 0 or (num_aged == 1 and aged is top):
                # no other class is aged, so the order cannot change during a run from `top`
                got = top.queue.take(n)
                out += got
                k = len(got)
                _consume(map(index.__delitem__, map(_request_id, got)))
                top.count -= k
                top.tokens = top.tokens - sum(map(_num_prompt_tokens, got)) if top.count else 0
                self.size -= k
                n -= k
            else:
                req = aged.queue.pop()
                self._forget(req)
                out.append(req)
                n -= 1
        if not self.size and self.expiry_heap:
            self.expiry_heap.clear()  # nothing queued: every entry is stale
        return out

    # -- inspection --------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.size

    def get(self, request_id: str) -> PendingRequest | None:
        return self._index.get(request_id)

    def depth(self, cls: QueueClass) -> int:
        return self._classes[cls].count

    def num_prompt_tokens(self, cls: QueueClass) -> int:
        return self._classes[cls].tokens

    def oldest_arrival(self, cls: QueueClass | None = None) -> float | None:
        """Earliest arrival still queued, in `cls` or over all classes."""
        if cls is not None:
            return self._classes[cls].queue.oldest_arrival()
        times = [cs.queue.oldest_arrival() for cs in self._classes if cs.count]
        return min(times) if times else None

    def __iter__(self) -> Iterator[PendingRequest]:
        """Everything queued, class by class in push order (not service order)."""
        for cs in self._classes:
            yield from cs.queue
