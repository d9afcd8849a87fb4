"""_launched_init: who hosts the logger in a launched job, which run ids the job gets, and how
failures reach every rank. The job's store and the Funnel are played by the test; the real
thing runs under torchrun in tests/processes/test_ddp.py."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from wandb_funnel import _launched_init
from wandb_funnel._constants import ENV_BIND_ADDR, ENV_RANK_PID
from wandb_funnel._launcher_env import DistEnv
from wandb_funnel._options import FunnelOptions, PerRankRuns, Topology
from wandb_funnel._worker.run import AttachInfo, Run
from wandb_funnel.errors import LoggerStartError


class Store:
    """An in-memory job store shared by the 'ranks' of one test."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}
        self.claims: dict[str, int] = {}

    def rendezvous(self, env: DistEnv, generation: int, timeout: float) -> Any:
        store = self

        class Rendezvous:
            def publish(self, key: str, value: dict[str, Any]) -> None:
                store.values[key] = value

            def claim(self, key: str) -> bool:
                store.claims[key] = store.claims.get(key, 0) + 1
                return store.claims[key] == 1

            def wait(self, key: str, what: str) -> dict[str, Any]:
                if key not in store.values:
                    raise LoggerStartError(f"no {what}")
                value = store.values[key]
                if "error" in value:
                    raise LoggerStartError(f"the hosting rank failed: {value['error']}")
                return dict(value)

        return Rendezvous()


class UnattachedRun(Run):
    """The hosting rank's run of a FakeFunnel: there is no logger to attach to."""

    def _attach(self, timeout: float) -> bool:
        return True


class FakeFunnel:
    made: ClassVar[list[FakeFunnel]] = []
    fail_with: Exception | None = None

    def __init__(self, options: FunnelOptions, *, topology: Topology, **kwargs: Any) -> None:
        self.options, self.topology, self.kwargs = options, topology, kwargs
        FakeFunnel.made.append(self)

    def start(self) -> FakeFunnel:
        if FakeFunnel.fail_with is not None:
            raise FakeFunnel.fail_with
        return self

    def attach_info(self) -> AttachInfo:
        return AttachInfo("ipc:///x/s", "tok", self.kwargs["id"], 1 << 20, 99, "host")

    tcp_address = "tcp://10.0.0.1:5555"

    @property
    def run(self) -> Run:
        return UnattachedRun(self.attach_info(), requested_rank=self.topology.owner_rank)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    import wandb_funnel._rendezvous

    shared = Store()
    # Recorded as absent: init_launched marks this process as a rank, which must not outlive
    # the test (a torchrun job started later in the session took its ranks for children).
    monkeypatch.setenv(ENV_RANK_PID, "")
    monkeypatch.delenv(ENV_RANK_PID)
    monkeypatch.setattr(wandb_funnel._rendezvous, "Rendezvous", shared.rendezvous)
    monkeypatch.setattr(_launched_init, "Funnel", FakeFunnel)
    monkeypatch.setattr(_launched_init, "route_ip", lambda master: "10.0.0.1")
    FakeFunnel.made, FakeFunnel.fail_with = [], None
    return shared


def _env(rank: int, world: int = 4, local_world: int = 2) -> DistEnv:
    return DistEnv(
        "torchrun",
        rank,
        world,
        rank % local_world,
        local_world,
        rank // local_world,
        "10.0.0.1",
        29500,
    )


def test_global_scope_rank0_hosts_one_run_for_every_rank(store: Store) -> None:
    run = _launched_init.init_launched(_env(0), FunnelOptions(), {"project": "p", "id": "base"})
    assert run.id == "base"
    (funnel,) = FakeFunnel.made
    assert funnel.kwargs == {"project": "p", "id": "base"}
    # Two nodes, one run: every rank expected from the start, TCP for the other node, and
    # (tier "auto" on two nodes) the node tier, the root on node 0.
    assert funnel.topology == Topology(0, 4, (0, 1, 2, 3), "10.0.0.1", None, node=0)
    assert store.values["base"] == {"id": "base"}
    assert store.values["logger/global"]["tcp"] == "tcp://10.0.0.1:5555"


@pytest.mark.parametrize(("tier", "world", "node"), [("flat", 4, None), ("auto", 2, None)])
def test_the_node_tier_is_off_when_flat_is_asked_or_the_job_has_one_node(
    store: Store, tier: str, world: int, node: int | None
) -> None:
    options = FunnelOptions(tier=tier)
    _launched_init.init_launched(_env(0, world=world), options, {"id": "base"})
    (funnel,) = FakeFunnel.made
    assert funnel.topology.node == node


def test_worker_scope_hosts_one_run_per_node_with_its_ranks(store: Store) -> None:
    options = FunnelOptions(rank_scope="worker", run_mode="new")
    run = _launched_init.init_launched(_env(2), options, {"id": "base"})
    assert run.id == "base-worker-1-rank-0"  # rank 2 is local rank 0 of node 1
    (funnel,) = FakeFunnel.made
    assert funnel.kwargs["id"] == "base-worker-1"
    assert funnel.topology.expected_ranks == (2, 3)
    assert funnel.topology.tcp_host is None  # the node's own run: IPC only
    assert funnel.topology.per_rank == PerRankRuns(
        "base-worker-1-rank-{local_rank}", "base-worker-1", 2
    )


def test_a_hosting_failure_is_published_so_the_other_ranks_fail_at_once(store: Store) -> None:
    FakeFunnel.fail_with = RuntimeError("wandb said no")
    with pytest.raises(RuntimeError, match="wandb said no"):
        _launched_init.init_launched(_env(0), FunnelOptions(), {"id": "base"})
    assert "wandb said no" in store.values["logger/global"]["error"]
    with pytest.raises(LoggerStartError, match="wandb said no"):
        _launched_init.init_launched(_env(1), FunnelOptions(), {})


def test_a_rank_on_another_node_cannot_reach_an_ipc_only_logger(store: Store) -> None:
    info = AttachInfo("ipc:///x/s", "tok", "base", 1 << 20, 99, "host")
    store.values["base"] = {"id": "base"}
    store.values["logger/global"] = {**info._asdict(), "tcp": None, "node": 0}
    with pytest.raises(LoggerStartError, match="listens on IPC only"):
        _launched_init.init_launched(_env(3), FunnelOptions(), {})


def test_route_ip_prefers_the_override_then_loopback_literals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_BIND_ADDR, "192.0.2.7")
    assert _launched_init.route_ip("10.0.0.1") == "192.0.2.7"
    monkeypatch.delenv(ENV_BIND_ADDR)
    assert _launched_init.route_ip("127.0.0.1") == "127.0.0.1"
    assert _launched_init.route_ip("localhost") == "127.0.0.1"


def test_an_installed_wandb_init_is_hosted_by_the_first_rank_that_calls(store: Store) -> None:
    """Megatron-LM logs from the last rank only: rank 3 calls first, so it hosts (wf.init's
    rank 0 would wait for a host that never comes); a later caller attaches to it."""
    run = _launched_init.init_launched(_env(3), FunnelOptions(), {"project": "p"}, True)
    (funnel,) = FakeFunnel.made
    assert funnel.topology.owner_rank == 3 and funnel.topology.expected_ranks == (0, 1, 2, 3)
    assert run.id == store.values["base"]["id"] == funnel.kwargs["id"]
    assert store.claims == {"base": 1, "logger/global": 1}
    # A rank that calls later does not host: it waits for the host's records in the store.
    store.values.clear()
    with pytest.raises(LoggerStartError, match="no run id"):
        _launched_init.init_launched(_env(0), FunnelOptions(), {}, True)
    assert len(FakeFunnel.made) == 1
