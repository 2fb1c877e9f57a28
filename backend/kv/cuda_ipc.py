"""CUDA IPC for prefix pull (issue 34): a peer backend's KV pages read in place, device to device.

Over ZeroMQ a pulled block goes device -> host -> socket -> host -> device: 0.32 GB/s end to end
on the H200's host (BENCHMARKS, "Prefix pull on the H200"), slower than recomputing a 16K-token
33B prefix. Two backends on one host can do better: the holder shares its block tensors' CUDA
memory once per answer (an IPC handle per tensor), the puller maps them and copies the blocks it
needs with one `index_select` / `index_copy_` pair per tensor, on the GPU (one GPU: HBM to HBM;
two GPUs of a host: over NVLink/PCIe peer access). The bytes never touch the host or the socket;
the socket carries block ids, handles and an interprocess event.

What is shared is what `torch.multiprocessing` shares for a CUDA tensor (`reduce_tensor`):
the storage's IPC handle and extent, torch's reference-count slot (the producer keeps a shared
memory counter per send; the consumer's mapping releases it), the producer's event for the
storage, and the view. We carry those fields in a protobuf message (`IpcTensor`), not a pickle,
and rebuild with torch's own `rebuild_cuda_tensor` so that the mapping cache and the counters
stay torch's. A tensor mapped once stays mapped (torch caches the storage by handle): later
answers from the same peer cost a dict lookup per tensor.

Ordering: the holder records an interprocess event after every write it had queued when it held
the blocks; the puller's stream waits for it before reading. Lifetime: the holder holds the
blocks against eviction until the puller's KvRelease (or a lease deadline), so nothing rewrites
them while they are read.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from proto import tidegate_pb2 as pb

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2)}


def available(device: torch.device) -> bool:
    """Whether this process can share or map CUDA memory (a CUDA device; Linux)."""
    return device.type == "cuda" and torch.cuda.is_available()


def share(tensors: list[torch.Tensor]) -> list[pb.IpcTensor]:
    """An IpcTensor per tensor (each call takes a fresh reference-count slot per tensor, which
    the puller's mapping releases)."""
    out = []
    for t in tensors:
        _, args = reduce_tensor(t)
        (_cls, size, stride, offset, _storage_cls, dtype, device, handle, storage_bytes,
         storage_offset_bytes, _grad, ref_handle, ref_offset, event_handle,
         event_sync_required) = args
        out.append(pb.IpcTensor(
            handle=handle, storage_bytes=storage_bytes,
            storage_offset_bytes=storage_offset_bytes, ref_counter_handle=ref_handle,
            ref_counter_offset=ref_offset, event_handle=event_handle or b"",
            event_sync_required=bool(event_sync_required), shape=list(size),
            stride=list(stride), offset=offset, dtype=str(dtype).removeprefix("torch."),
            device=int(device)))
    return out


def open_tensors(descs) -> list[torch.Tensor]:
    """The peer's tensors, mapped into this process (torch caches the mapping per storage)."""
    out = []
    for d in descs:
        dtype = _DTYPES.get(d.dtype)
        if dtype is None:
            raise ValueError(f"IPC tensor of unknown dtype {d.dtype!r}")
        out.append(rebuild_cuda_tensor(
            torch.Tensor, torch.Size(d.shape), tuple(d.stride), int(d.offset),
            torch.storage.TypedStorage, dtype, int(d.device), d.handle, int(d.storage_bytes),
            int(d.storage_offset_bytes), False, d.ref_counter_handle, int(d.ref_counter_offset),
            d.event_handle or None, bool(d.event_sync_required)))
    return out


def record_event(stream) -> bytes:
    """An interprocess event recorded on `stream` now (after the work queued there)."""
    event = torch.cuda.Event(interprocess=True)
    event.record(stream)
    return bytes(event.ipc_handle())


def wait_event(handle: bytes, device: torch.device) -> None:
    """Make this process's current stream on `device` wait for the peer's event."""
    if not handle:
        return
    event = torch.cuda.Event.from_ipc_handle(device, handle)
    torch.cuda.current_stream(device).wait_event(event)
