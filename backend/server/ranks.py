"""Starting the rank processes, building each rank's engine, watching the ranks.

    tidegate backend --tensor-parallel-size N ...      (rank 0: this process)
      -> N-1 x `python -m backend.server.ranks <rank> <rendezvous> <config JSON> [<per host>]`

Over several hosts (a LeaderWorkerSet's pods, deploy/): `--tp-nodes K --tp-rendezvous HOST:PORT`
on every host with the same engine flags; host 0 (`--tp-node-rank 0`, the default) serves and
hosts the store on PORT, host j starts ranks j*N/K .. (j+1)*N/K - 1 on its own devices
(`node_main`) and serves nothing. Each host watches its own ranks; a rank on another host that
dies fails the next collective (gloo: its sockets close; NCCL: the collective timeout).

Rank 0 hosts the rendezvous store, starts the followers (plain subprocesses: the config travels
as JSON in argv, nothing is pickled), and every rank then builds the same thing from the same
config (`build_rank`): its shard of the model, a KV pool of the same number of blocks (the
minimum over the ranks), a runner, the serving transforms (FP8 weights, CUDA graphs) in the same
order, so that the collectives inside them line up. Rank 0 wraps its runner in a
`LeaderRunner` and serves; the followers run `steps.follow`.

Device: rank r uses `cuda:(i + r)` for `--device cuda:i` (cuda = cuda:0); on the CPU every rank
shares the host (gloo over loopback), each with its own torch threads.

A rank's death: rank 0's watchdog thread waits on each follower process. When one exits while
serving, it records why, aborts the NCCL group (a collective blocked on the dead rank returns;
gloo fails by itself when the peer's sockets close) and sends this process SIGTERM: the worker
then stops the way SIGTERM stops it, answering every request in flight with an error (the step
that was running fails with `RankFailure`, whose message names the rank), and `tidegate
backend` exits 1. Followers exit when rank 0 goes: their next broadcast fails, and a thread
watches the parent process as well (NCCL would block instead).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict

import torch

from backend.distributed.group import Rendezvous, TPGroup
from backend.engine.assemble import BackendConfig, ServingOptions, build_runner, engine_config
from backend.errors import ModelLoadError
from backend.model.loader import LoadedModel
from backend.runner.step import ModelRunner
from backend.server.rank_steps import LeaderHostKV, LeaderRunner, follow

log = logging.getLogger("tidegate.backend")
STOP_TIMEOUT_S = 30.0
PARENT_WATCH_S = 0.5


@dataclasses.dataclass(frozen=True)
class MultiHost:
    """A tensor-parallel group over `nodes` hosts, `size / nodes` ranks on each."""

    nodes: int = 1
    node_rank: int = 0
    rendezvous: str | None = None  # HOST:PORT of host 0's store (host 0 binds PORT)

    def check(self, size: int) -> None:
        if self.nodes < 1 or size % self.nodes:
            raise ModelLoadError(f"--tp-nodes {self.nodes} must divide --tensor-parallel-size "
                                 f"{size}")
        if not 0 <= self.node_rank < self.nodes:
            raise ModelLoadError(f"--tp-node-rank {self.node_rank} not in 0..{self.nodes - 1}")
        if self.nodes > 1:
            host, _, port = (self.rendezvous or "").rpartition(":")
            if not host or not port.isdigit() or int(port) == 0:
                raise ModelLoadError("--tp-nodes > 1 needs --tp-rendezvous HOST:PORT (a fixed "
                                     "port, host 0's address)")

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = (self.rendezvous or "").rpartition(":")
        return host.strip("[]"), int(port)


def rank_device(device: str, rank: int, size: int, per_host: int | None = None) -> torch.device:
    """This rank's device: the (rank mod ranks-per-host)-th GPU from --device on its host."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    per_host = per_host or size
    first = dev.index or 0
    have = torch.cuda.device_count()
    if first + per_host > have:
        raise ModelLoadError(f"--tensor-parallel-size {size} ({per_host} a host) from {device} "
                             f"needs GPUs {first}..{first + per_host - 1}; this machine has {have}")
    return torch.device("cuda", first + rank % per_host)


def check_options(cfg: BackendConfig, size: int) -> None:
    if size < 1:
        raise ModelLoadError(f"--tensor-parallel-size must be >= 1, got {size}")
    if cfg.model == "echo":
        raise ModelLoadError("--model echo has no weights to split: --tensor-parallel-size 1")


def build_rank(cfg: BackendConfig, serving: ServingOptions, group: TPGroup,
               ) -> tuple[ModelRunner, LoadedModel, dict, object]:
    """One rank's shard, KV pool, host KV tier (`--host-kv-gib`, per rank: a rank's host blocks
    hold its slice of the KV), runner and serving transforms (every rank runs this): the
    assembler's `build_runner` for this rank's group."""
    # every rank captures its graphs at start-up, in the same order (their collectives pair up)
    return build_runner(cfg, dataclasses.replace(serving, capture=True), group)


def leader_engine(cfg: BackendConfig, runner: ModelRunner, loaded: LoadedModel, host_kv,
                  group: TPGroup, failure=lambda: None):
    """Rank 0's engine: the scheduler over a `LeaderRunner` (and the host tier's copies sent
    to the other ranks before its own)."""
    from backend.engine.assemble import _eos_ids
    from backend.engine.continuous import Engine

    leader = LeaderRunner(runner, group, failure)
    engine_cfg = engine_config(cfg, runner, host_kv)
    tier = LeaderHostKV(host_kv, leader.sender) if host_kv is not None else None
    return Engine(leader, engine_cfg, eos_token_ids=_eos_ids(loaded), host_kv=tier)


class Ranks:
    """Rank 0's handle on the followers: the watchdog, and stopping them."""

    def __init__(self, procs: dict[int, subprocess.Popen], group: TPGroup) -> None:
        self.procs, self.group = procs, group
        self.leader: LeaderRunner | None = None
        self.stopping = False
        self.armed = False  # SIGTERM ourselves on a death only once the worker handles it
        self.reason: str | None = None  # why the group is broken (a rank died)
        self._lock = threading.Lock()
        for rank, proc in procs.items():
            threading.Thread(target=self._watch, args=(rank, proc), daemon=True,
                             name=f"tp-watch-{rank}").start()

    def failure(self) -> str | None:
        return self.reason

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        with self._lock:
            if self.stopping or self.reason is not None:
                return
            self.reason = f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {code}"
        print(f"tidegate backend: {self.reason}; stopping", file=sys.stderr, flush=True)
        self.group.abort()
        with self._lock:
            armed = self.armed
        if armed:  # else start-up fails by itself (its next collective), or `arm` sends it
            os.kill(os.getpid(), signal.SIGTERM)  # the worker's SIGTERM path fails what is in flight

    def arm(self) -> None:
        """Called once the worker's SIGTERM handler is installed: from now on a rank's death
        stops the worker through it (a death before this is acted on now)."""
        with self._lock:
            self.armed = True
            dead = self.reason is not None and not self.stopping
        if dead:
            os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> int:
        """Stop the followers (tell them, wait, then kill); 1 if a rank had failed, else 0."""
        with self._lock:
            self.stopping = True
        if self.reason is None and self.leader is not None:
            try:
                self.leader.stop()
            except RuntimeError:
                pass
        if self.reason is not None:  # the group is broken: the others cannot stop cleanly
            self.kill()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.group.close()
        return 1 if self.reason is not None else 0

    def kill(self) -> None:
        with self._lock:
            self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _start_ranks(ranks: range, rendezvous: str, config_json: str, per_host: int
                 ) -> dict[int, subprocess.Popen]:
    return {rank: subprocess.Popen([sys.executable, "-m", "backend.server.ranks", str(rank),
                                    rendezvous, config_json, str(per_host)])
            for rank in ranks}


def start_tp_engine(cfg: BackendConfig, serving: ServingOptions, size: int,
                    hosts: MultiHost = MultiHost()):
    """Rank 0: start this host's followers, build this rank, and the engine that serves.
    Returns (engine, loaded, serving info, ranks)."""
    check_options(cfg, size)
    hosts.check(size)
    per_host = size // hosts.nodes
    device = rank_device(cfg.device, 0, size, per_host)
    port = hosts.address[1] if hosts.nodes > 1 else 0  # the other hosts were told this port
    rdv, store = TPGroup.host_store(size, port=port)
    config_json = json.dumps({"backend": asdict(cfg), "serving": asdict(serving)})
    procs = _start_ranks(range(1, per_host), f"{rdv.host}:{rdv.port}:{rdv.size}", config_json,
                         per_host)
    group = TPGroup.join(0, rdv, device, store=store)
    ranks = Ranks(procs, group)
    try:
        runner, loaded, info, host_kv = build_rank(cfg, serving, group)
    except BaseException as exc:
        ranks.kill()
        if ranks.reason is not None and not isinstance(exc, ModelLoadError):
            raise ModelLoadError(f"{ranks.reason} while starting (see its error above)") from None
        raise
    engine = leader_engine(cfg, runner, loaded, host_kv, group, ranks.failure)
    ranks.leader = engine.runner
    info["tensor_parallel"] = f"{size} ({'nccl' if device.type == 'cuda' else 'gloo'})"
    return engine, loaded, info, ranks


def node_main(cfg: BackendConfig, serving: ServingOptions, size: int, hosts: MultiHost) -> int:
    """Host j > 0 of a multi-host group: run its ranks until one of them exits (host 0 stopped,
    or a rank failed), then stop the others; 1 unless every rank exited 0."""
    check_options(cfg, size)
    hosts.check(size)
    per_host = size // hosts.nodes
    host, port = hosts.address
    first = hosts.node_rank * per_host
    config_json = json.dumps({"backend": asdict(cfg), "serving": asdict(serving)})
    procs = _start_ranks(range(first, first + per_host), f"{host}:{port}:{size}", config_json,
                         per_host)
    print(f"tidegate backend: host {hosts.node_rank} of {hosts.nodes}: ranks {first}.."
          f"{first + per_host - 1} joining {host}:{port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs.values()])
    codes = []
    while procs:
        for rank, proc in list(procs.items()):
            if proc.poll() is not None:
                codes.append(procs.pop(rank).returncode)
                for other in procs.values():  # one gone: the group is broken
                    other.terminate()
        time.sleep(PARENT_WATCH_S)
    return 0 if all(c == 0 for c in codes) else 1


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_WATCH_S)
    os._exit(1)  # rank 0 is gone: nothing left to follow


def follower_main(argv: list[str]) -> int:
    rank = int(argv[0])
    host, port, size = argv[1].rsplit(":", 2)
    spec = json.loads(argv[2])
    per_host = int(argv[3]) if len(argv) > 3 else int(size)
    cfg = BackendConfig(**spec["backend"])
    serving = ServingOptions(**spec["serving"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C reaches the group: rank 0 stops us
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        device = rank_device(cfg.device, rank, int(size), per_host)
        group = TPGroup.join(rank, Rendezvous(host, int(port), int(size)), device)
        runner, _, _, host_kv = build_rank(cfg, serving, group)
    except ModelLoadError as exc:
        print(f"tidegate backend: rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        follow(runner, group, host_kv)
    except RuntimeError as exc:  # rank 0 died or aborted the group
        print(f"tidegate backend: rank {rank}: stopping: {(str(exc).splitlines() or [''])[0]}",
              file=sys.stderr, flush=True)
        return 1
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(follower_main(sys.argv[1:]))
