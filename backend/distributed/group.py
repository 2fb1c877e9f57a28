"""One rank's view of the tensor-parallel group: the collectives the model calls.

`TPGroup` wraps the default `torch.distributed` process group (NCCL on CUDA, gloo on the CPU)
for the model's tensors, and a second gloo group over the same ranks for the step plans rank 0
sends (`backend.server.rank_steps`): those are host data, and on CUDA a gloo group moves them
without a host->device copy and without queueing behind the model's collectives.

Every collective here is shape-static and never reads device data on the host, so a CUDA graph
captures them (NCCL >= 2.9.6 supports capture). That path is written but untested: it needs two
GPUs.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from backend.distributed.sharding import Shard

# A rank that stops answering (not dead: its sockets stay open) fails a collective after this.
# A dead rank fails it at once on gloo; on NCCL rank 0's watchdog aborts the group
# (`backend.server.ranks`).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# torch >= 2.13 renamed all_gather_into_tensor (deprecated there); the GPU machine has 2.11
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: rank 0's TCP store (port 0: the OS picks one, no race)."""
    host: str
    port: int
    size: int


def device_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


class TPGroup:
    def __init__(self, rank: int, size: int, device: torch.device, shard: Shard | None = None,
                 control=None) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.shard = shard  # set once the config is known (`attach`)
        self.control = control  # the gloo group for step plans (None: the default group)

    @classmethod
    def join(cls, rank: int, rdv: Rendezvous, device: torch.device, store=None) -> TPGroup:
        """Initialize torch.distributed for this process (rank 0 passes the store it hosts)."""
        if store is None:
            store = dist.TCPStore(rdv.host, rdv.port, rdv.size, is_master=False,
                                  timeout=COLLECTIVE_TIMEOUT)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # `device_id` binds NCCL to this GPU at once (eager init), as graph capture needs
        kw = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(device_backend(device), store=store, rank=rank,
                                world_size=rdv.size, timeout=COLLECTIVE_TIMEOUT, **kw)
        control = dist.new_group(backend="gloo") if device.type == "cuda" else None
        return cls(rank, rdv.size, device, control=control)

    @staticmethod
    def host_store(size: int, host: str = "127.0.0.1", port: int = 0) -> tuple[Rendezvous, object]:
        """Rank 0's store; `host` is where this host's ranks reach it. A port other than 0 is
        the fixed one the ranks of other hosts were told (backend.server.ranks.MultiHost)."""
        store = dist.TCPStore(host, port, size, is_master=True, timeout=COLLECTIVE_TIMEOUT,
                              wait_for_workers=False)
        return Rendezvous(host, store.port, size), store

    def attach(self, shard: Shard) -> None:
        self.shard = shard

    # ---- what the model calls (backend.model.llama) ----------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's `x`, in place (the row-parallel layers' partial sums)."""
        dist.all_reduce(x)
        return x

    def embed(self, embedding: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary-parallel lookup: each rank looks up the ids in its rows, zeros the others,
        and the sum over ranks is the full embedding."""
        start = self.shard.vocab_start
        local = input_ids - start
        outside = (local < 0) | (local >= self.shard.vocab_rows)
        h = embedding(local.masked_fill(outside, 0))
        return self.all_reduce(h.masked_fill(outside[:, None], 0))

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, Vp] per rank -> [N, V]: every rank's vocabulary slice side by side."""
        n, vp = logits.shape
        out = logits.new_empty(self.size * n, vp)
        _all_gather_single(out, logits.contiguous())
        full = out.view(self.size, n, vp).permute(1, 0, 2).reshape(n, self.size * vp)
        return full[:, :self.shard.config.vocab_size]

    # ---- host data (step plans, sizes) -----------------------------------------------------
    def broadcast_ints(self, values: torch.Tensor) -> torch.Tensor:
        """int64 CPU tensor from rank 0 to every rank (in place on the others)."""
        dist.broadcast(values, 0, group=self.control)
        return values

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def time_all_reduce(self, tokens: int, hidden: int, dtype: torch.dtype, repeats: int,
                        graph: bool = False) -> float:
        """Mean seconds per all-reduce of a [tokens, hidden] tensor over `repeats`
        back-to-back calls (every rank must call this). `graph`: the calls captured in one CUDA
        graph and replayed, as the step graphs run them."""
        x = torch.ones(tokens, hidden, dtype=dtype, device=self.device)
        cuda = self.device.type == "cuda"

        def calls():
            for _ in range(repeats):
                dist.all_reduce(x)

        for _ in range(3):  # warm-up: NCCL connects and picks its algorithm outside capture
            calls()
        run = calls
        if cuda and graph:
            torch.cuda.synchronize(self.device)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                calls()
            g.replay()
            run = g.replay
        if cuda:
            torch.cuda.synchronize(self.device)
        self.barrier()
        t0 = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - t0) / repeats

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def abort(self) -> None:
        """Make collectives blocked on a dead rank return (NCCL; gloo fails by itself when a
        peer's sockets close). Untested without two GPUs."""
        if self.device.type != "cuda":
            return
        try:
            abort_all = getattr(dist.distributed_c10d, "_abort_process_group", None)  # torch >= 2.6
            if abort_all is not None:
                abort_all()
            else:
                dist.distributed_c10d._get_default_group()._get_backend(self.device).abort()
        except Exception as exc:  # noqa: BLE001 -- best effort: the watchdog exits the process next
            print(f"tidegate backend: could not abort the NCCL group: {exc!r}", file=sys.stderr)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


