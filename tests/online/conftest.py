"""Fixtures of the online tests: one OpenWandb server per test session, a fault proxy in front
of it per test, and a fresh project per test.

- ``openwandb`` (session): an ``OpenWandb`` on 127.0.0.1 (``tests/online/openwandb.py``);
  installed on first use into ``.venv-openwandb``. A failed install or start FAILS the tests
  that use it, with the reason: an online test is never skipped for want of a server.
- ``fault_proxy`` (function): a healthy ``FaultProxy`` (``tests/online/fault_proxy.py``) in
  front of that server, counters at zero; stopped after the test.
- ``online`` (function): the two, with this test's own project name, the environment a
  wandb process needs to go through the proxy (``online.env``), and ``online.run(run_id)``.
"""

from __future__ import annotations

import pathlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.online.fault_proxy import FaultProxy
from tests.online.openwandb import OpenWandb, OpenWandbUnavailableError, ServerRun


@pytest.fixture(scope="session")
def openwandb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenWandb]:
    server = OpenWandb(tmp_path_factory.mktemp("openwandb") / "data")
    try:
        server.start()
    except OpenWandbUnavailableError as exc:
        server.stop()
        pytest.fail(f"OpenWandb, the online tests' server, is not available: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fault_proxy(openwandb: OpenWandb) -> Iterator[FaultProxy]:
    if openwandb.paused:  # a test that paused the server and failed before resuming it
        openwandb.resume()
    if not openwandb.answers(timeout=5.0):  # a test that killed it: serve again
        openwandb.restart()
    with FaultProxy(openwandb.port) as proxy:
        yield proxy


@dataclass
class Online:
    """One online test's server, proxy and project."""

    server: OpenWandb
    proxy: FaultProxy
    project: str

    @property
    def env(self) -> dict[str, str]:
        """WANDB_MODE, WANDB_BASE_URL (the proxy), WANDB_API_KEY and WANDB_PROJECT."""
        return {**self.server.env(self.proxy.url), "WANDB_PROJECT": self.project}

    def run(self, run_id: str) -> ServerRun:
        """What arrived on the server for ``run_id`` (its exit code from the proxy)."""
        return self.server.run(self.project, run_id, proxy=self.proxy)

    def run_ids(self) -> list[str]:
        return self.server.run_ids(self.project)

    def data_dir(self) -> pathlib.Path:
        return self.server.data_dir


@pytest.fixture
def online(openwandb: OpenWandb, fault_proxy: FaultProxy, request: pytest.FixtureRequest) -> Online:
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:60]
    return Online(openwandb, fault_proxy, f"{name}-{uuid.uuid4().hex[:8]}")
