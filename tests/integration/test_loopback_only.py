"""Issue 52.1: nothing `mlsys-flows server` starts listens beyond loopback. Every process of its tree
(the Prefect server and its uvicorn, the process worker, the warm cluster's scheduler, nannies and
workers) is asked for its listening TCP sockets; any on 0.0.0.0, :: or another non-loopback address
fails the test (a Dask worker's comm port runs pickled tasks unauthenticated). The dashboard link a
run prints (prefect_dask's DaskTaskRunner logs ``client.dashboard_link``) must answer, not 404."""
from __future__ import annotations

import contextlib
import ipaddress
import os

import httpx
import psutil
import pytest
from distributed import Client

from mlsys_flows.platform.server import WARM_WORKERS

pytestmark = pytest.mark.integration


@pytest.fixture
def server(user_server):
    """The session's `mlsys-flows server` (tests/integration/conftest.py), as a user started it."""
    return user_server.cli, user_server.info


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback


def listening(pid: int) -> list[tuple[str, int, str, int]]:
    """(ip, port, process name and arguments, pid) of every listening TCP socket of ``pid`` and its
    descendants."""
    root = psutil.Process(pid)
    found = []
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            conns = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections("inet")
            what = " ".join(proc.cmdline())[:160]
            found += [(c.laddr.ip, c.laddr.port, what, proc.pid) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def test_a_runs_embedded_cluster_is_loopback_and_its_link_answers():
    """A run with no cluster and no server starts DaskCluster()'s LocalCluster (its scheduler in the
    run's process): every port it opens is loopback, and the dashboard link the runner logs answers.
    First in the module: the server's processes are not up yet."""
    from mlsys_flows.blocks import DaskCluster

    before = set(listening(os.getpid()))
    with DaskCluster().task_runner() as runner:
        link = runner.client.dashboard_link
        opened = set(listening(os.getpid())) - before
        status = httpx.get(link, timeout=30, follow_redirects=True).status_code
    # the scheduler's comm and HTTP ports, and each worker's comm and HTTP ports (nannies: in-process)
    assert len({pid for *_, pid in opened}) >= 1 + DaskCluster().n_workers, opened
    assert all(_loopback(ip) for ip, *_ in opened), opened
    assert _loopback(httpx.URL(link).host) and status == 200, (link, status)


def test_every_listening_socket_is_loopback(server):
    cli, info = server
    sockets = listening(cli.proc.pid)
    ports = {port for _, port, _, _ in sockets}
    api_port = int(info["api_url"].rsplit(":", 1)[1].split("/")[0])
    scheduler_port = int(info["dask_address"].rsplit(":", 1)[1])
    with Client(info["dask_address"], timeout=60) as client:
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
    assert len(workers) == WARM_WORKERS
    # the test sees the sockets it must judge: the API, the scheduler and each worker's comm port
    expected = {api_port, scheduler_port, *(int(w.rsplit(":", 1)[1]) for w in workers)}
    assert expected <= ports, (expected - ports, sockets)
    exposed = [s for s in sockets if not _loopback(s[0])]
    assert not exposed, "listening beyond loopback:\n" + "\n".join(f"{ip}:{port}  pid {pid}  {what}"
                                                                   for ip, port, what, pid in exposed)


def test_the_dashboard_link_a_run_prints_answers(server):
    _, info = server
    with Client(info["dask_address"], timeout=60) as client:
        link = client.dashboard_link  # what prefect_dask's DaskTaskRunner logs when it connects
    if link:
        assert _loopback(httpx.URL(link).host), link
        assert httpx.get(link, timeout=30, follow_redirects=True).status_code == 200, link

