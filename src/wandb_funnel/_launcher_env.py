"""Which distributed job this process belongs to, read from the launcher's environment.

torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``),
SLURM (``SLURM_PROCID``, …), Open MPI (``OMPI_COMM_WORLD_*``) and PMI/MPICH (``PMI_RANK``, …),
in that order of precedence. Pure: no torch, no I/O beyond the mapping it is given.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import NamedTuple

from wandb_funnel._constants import ENV_RANK_PID


class DistEnv(NamedTuple):
    """One process's place in a distributed job."""

    launcher: str  # "torchrun", "slurm", "openmpi", "pmi" or "torch.distributed"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str | None = None
    master_port: int | None = None
    restart: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT: a restarted job is a new one

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))

    @property
    def first_rank_on_node(self) -> int:
        return self.rank - self.local_rank


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def _slurm_tasks_per_node(env: Mapping[str, str]) -> int | None:
    direct = _int(env, "SLURM_NTASKS_PER_NODE")
    if direct is not None:
        return direct
    spec = env.get("SLURM_TASKS_PER_NODE", "")  # e.g. "4(x2)" or "4,3"
    match = re.match(r"(\d+)", spec)
    return int(match.group(1)) if match else None


def detect(env: Mapping[str, str] | None = None) -> DistEnv | None:
    """The job this process belongs to, or None when no launcher set ranks.

    A process that merely inherited its parent's rank variables (a DataLoader worker, a Pool
    child of a rank: ``_WANDB_FUNNEL_RANK_PID`` names another pid) is not a rank of the job.
    """
    env = os.environ if env is None else env
    owner = env.get(ENV_RANK_PID)
    if owner is not None and owner != str(os.getpid()):
        return None
    master_addr = env.get("MASTER_ADDR")
    master_port = _int(env, "MASTER_PORT")
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is not None and world is not None:
        local_rank = _int(env, "LOCAL_RANK") or 0
        local_world = _int(env, "LOCAL_WORLD_SIZE") or world
        node = _int(env, "GROUP_RANK")
        return DistEnv(
            "torchrun",
            rank,
            world,
            local_rank,
            local_world,
            node if node is not None else rank // max(1, local_world),
            master_addr,
            master_port,
            _int(env, "TORCHELASTIC_RESTART_COUNT") or 0,
        )
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    if rank is not None and world is not None:
        local_world = _slurm_tasks_per_node(env) or world
        return DistEnv(
            "slurm",
            rank,
            world,
            _int(env, "SLURM_LOCALID") or 0,
            local_world,
            _int(env, "SLURM_NODEID") or 0,
            master_addr,
            master_port,
        )
    # Open MPI's OMPI_COMM_WORLD_NODE_RANK is a rank *on* a node, not the node's number: the
    # node is derived from the rank, as for PMI (ranks are placed node by node).
    for launcher, rank_var, size_var, local_var, local_size_var in (
        (
            "openmpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ):
        rank, world = _int(env, rank_var), _int(env, size_var)
        if rank is not None and world is not None:
            local_world = _int(env, local_size_var) or world
            return DistEnv(
                launcher,
                rank,
                world,
                _int(env, local_var) or 0,
                local_world,
                rank // max(1, local_world),
                master_addr,
                master_port,
            )
    return None


def from_process_group(env: Mapping[str, str] | None = None) -> DistEnv | None:
    """The job of an initialized ``torch.distributed`` default process group, for launchers
    that set no rank variables: ``mp.spawn``, Lightning's subprocess launcher (``LOCAL_RANK``,
    ``NODE_RANK``, ``WORLD_SIZE``, no ``RANK``), a user's own. Never imports torch: a process
    that has not imported it has no process group.

    The node layout comes from ``LOCAL_WORLD_SIZE`` when set; otherwise every rank is taken
    to be on this node (set ``LOCAL_WORLD_SIZE`` for several nodes without torchrun or SLURM).
    """
    env = os.environ if env is None else env
    owner = env.get(ENV_RANK_PID)
    if owner is not None and owner != str(os.getpid()):
        return None
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    data = sys.modules.get("torch.utils.data")
    if data is not None and data.get_worker_info() is not None:
        return None  # a DataLoader worker forked from a rank: the group's state is its parent's
    rank, world = int(dist.get_rank()), int(dist.get_world_size())
    local_world = _int(env, "LOCAL_WORLD_SIZE") or world
    local_rank = _int(env, "LOCAL_RANK")
    if local_rank is None:
        local_rank = rank % max(1, local_world)
    return DistEnv(
        "torch.distributed",
        rank,
        world,
        local_rank,
        local_world,
        rank // max(1, local_world),
        env.get("MASTER_ADDR"),
        _int(env, "MASTER_PORT"),
    )
