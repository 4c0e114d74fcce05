"""torch.distributed process groups for ranks started elsewhere (``mlsys_flows/platform/ranks.py`` starts them as
Dask tasks, one per worker process): what a rank knows of itself, the rendezvous store, and the
group's life. Pure torch: no Dask, no Prefect."""
from __future__ import annotations

import ipaddress
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator


@dataclass(frozen=True)
class RankInfo:
    """One rank of a launch: its place in the world, the backend, its device, the launch."""

    rank: int
    world_size: int
    backend: str  # "gloo" (CPU) or "nccl" (every rank has a GPU)
    device: str  # "cpu" or "cuda:N", the device this rank computes on
    launch_id: str  # one launch of the ranks; a relaunch after a failure gets a new one
    host: str  # the host the rank's worker process runs on
    workers: tuple[str, ...] = ()  # the worker of every rank of the launch, in rank order
    # the launch's rendezvous store (a torch.distributed Store): coordination beyond collectives
    store: Any = field(default=None, repr=False, compare=False)


def choose_backend(gpus_per_rank: list[int]) -> str:
    """nccl when every rank's process sees a GPU, else gloo (collectives on CPU tensors)."""
    return "nccl" if gpus_per_rank and all(n > 0 for n in gpus_per_rank) else "gloo"


def local_devices(hosts: list[str], backend: str) -> list[str]:
    """The device of each rank: with nccl, ranks on one host take its GPUs in rank order."""
    if backend != "nccl":
        return ["cpu"] * len(hosts)
    seen: dict[str, int] = {}
    devices = []
    for host in hosts:
        devices.append(f"cuda:{seen.get(host, 0)}")
        seen[host] = seen.get(host, 0) + 1
    return devices


def master_store(host: str, world_size: int, timeout_s: float):
    """Rank 0's rendezvous store on ``host``, on a port the OS picks (``.port`` says which): no race
    for a port between choosing it and binding it. The listening socket is bound here and handed to
    the store: given a host, TCPStore itself still listens on every interface ([::]), and its port
    accepts any client."""
    import socket

    import torch.distributed as dist

    import torch

    family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    # libuv's store (torch's default since 2.4) honours a listening descriptor from torch 2.8 on
    libuv = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 8)
    try:
        listener.bind(address)
        listener.listen(max(world_size, 128))
        store = dist.TCPStore(host, listener.getsockname()[1], world_size=world_size, is_master=True,
                              timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                              master_listen_fd=listener.fileno(), use_libuv=libuv)
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the descriptor now and closes it with itself
    return store


def peer_store(host: str, port: int, world_size: int, timeout_s: float):
    """A rank's connection to rank 0's store."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world_size=world_size, is_master=False, timeout=timedelta(seconds=timeout_s))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextmanager
def process_group(store, info: RankInfo, timeout_s: float) -> Iterator[None]:
    """The default process group of this rank for the block's duration, destroyed on the way out
    whatever happens. A collective waits at most ``timeout_s`` for a peer (a peer whose process
    died fails it sooner: its sockets close)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a torch.distributed process group")
    if info.backend == "nccl":
        torch.cuda.set_device(torch.device(info.device))
    # ranks on loopback: gloo (and NCCL's bootstrap socket) would otherwise pick the interface the host
    # name resolves to, or the first one that is not loopback, and listen there
    variable = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}.get(info.backend)
    restore = None
    if variable and _is_loopback(info.host) and variable not in os.environ and os.path.exists("/sys/class/net/lo"):
        os.environ[variable] = "lo"
        restore = variable
    try:
        dist.init_process_group(info.backend, store=store, rank=info.rank, world_size=info.world_size,
                                timeout=timedelta(seconds=timeout_s))
    finally:
        if restore:
            os.environ.pop(restore, None)
    try:
        yield
    finally:
        dist.destroy_process_group()


def gloo_available() -> bool:
    """torch.distributed with the gloo backend (CPU collectives) is built into this torch."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()
