"""_rendezvous: how a launched job's ranks find their logger, over a real torch TCPStore
hosted in this process (what torchrun's agent hosts for a real job)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import wandb_funnel._rendezvous as rendezvous_module
from wandb_funnel._launcher_env import DistEnv
from wandb_funnel._rendezvous import Rendezvous
from wandb_funnel.errors import FunnelError, LoggerStartError

dist = pytest.importorskip("torch.distributed")  # CI installs torch: this always runs there


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Any:
    tcp = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size=None,
        is_master=True,
        timeout=timedelta(seconds=5),
        wait_for_workers=False,
    )
    monkeypatch.setattr(rendezvous_module, "_job_store", lambda env, timeout: tcp)
    return tcp


ENV = DistEnv("torchrun", 0, 2, 0, 2, 0, "127.0.0.1", 29500, restart=1)


def test_published_values_reach_a_waiting_rank(store: Any) -> None:
    host, other = Rendezvous(ENV, 0, 2.0), Rendezvous(ENV, 0, 2.0)
    host.publish("logger/global", {"address": "ipc:///x", "tcp": None})
    assert other.wait("logger/global", "logger address") == {"address": "ipc:///x", "tcp": None}
    # Keys are scoped by restart and generation: a restarted job never reads a stale logger.
    # (store.get, not store.check: TCPStore.check has a Python binding only from torch 2.3)
    assert store.get("wandb_funnel/1/0/logger/global")


def test_a_published_failure_and_a_timeout_are_named(store: Any) -> None:
    host, other = Rendezvous(ENV, 1, 0.3), Rendezvous(ENV, 1, 0.3)
    with pytest.raises(LoggerStartError, match="no logger address appeared"):
        other.wait("logger/global", "logger address")
    host.publish("logger/global", {"error": "RuntimeError: no disk"})
    with pytest.raises(LoggerStartError, match="hosting rank failed: RuntimeError: no disk"):
        other.wait("logger/global", "logger address")


def test_a_slurm_rank_without_a_process_group_is_told_what_to_call() -> None:
    slurm = DistEnv("slurm", 1, 2, 1, 2, 0)
    with pytest.raises(FunnelError, match="init_process_group"):
        Rendezvous(slurm, 0, 1.0)
