"""Fixtures of the integration layer.

- ``user_server``: one `mlsys-flows server` for the session (Prefect server, process work pool and
  worker, blocks, warm Dask cluster), started as a user starts it: the platform, loopback and
  warm-cluster tests share it. The test marked ``stops_the_session_server`` (Ctrl-C with a run in
  flight) runs last of the session; teardown Ctrl-Cs a server still running, and either way no
  process it started may remain.
"""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from platform_fixtures import ServerCLI

from mlsys_flows.systems.common.net import free_port


def pytest_configure(config):
    config.addinivalue_line("markers", "stops_the_session_server: Ctrl-Cs the session's `mlsys-flows server`; "
                                       "runs last of the session")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    last = [item for item in items if item.get_closest_marker("stops_the_session_server")]
    items[:] = [item for item in items if item not in last] + last


@pytest.fixture(scope="session")
def user_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("platform") / ".mlsys-flows"
    cli = ServerCLI(root, free_port())
    try:
        deadline = time.monotonic() + 300  # a hang guard only: server.json is written once all is up
        while not cli.state.exists():
            assert cli.proc.poll() is None and time.monotonic() < deadline, cli.log.read_text()[-3000:]
            time.sleep(0.2)
        info = json.loads(cli.state.read_text())
        assert len(cli.family()) >= 2  # server and worker (and their children)
        yield SimpleNamespace(api_url=info["api_url"], ui_url=info["ui_url"], dask_address=info["dask_address"],
                              info=info, root=root, dir=cli.state.parent, cli=cli)
    finally:
        if cli.proc.poll() is None:
            _, strays = cli.ctrl_c()
            assert not strays, [p.cmdline() for p in strays]
    assert cli.proc.returncode == 0, cli.log.read_text()[-3000:]
    assert not cli.state.exists()
