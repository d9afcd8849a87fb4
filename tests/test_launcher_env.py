"""Launcher detection: torchrun, SLURM, Open MPI and PMI environments, and inherited ranks."""

from __future__ import annotations

import os

from wandb_funnel._launcher_env import detect


def test_torchrun() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    d = detect(env)
    assert d is not None and d.launcher == "torchrun"
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size, d.node_rank) == (5, 8, 1, 4, 1)
    assert d.num_nodes == 2 and d.first_rank_on_node == 4 and d.restart == 2
    assert (d.master_addr, d.master_port) == ("10.0.0.1", 29500)


def test_slurm_with_tasks_per_node_spec() -> None:
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    d = detect(env)
    assert d is not None and d.launcher == "slurm"
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size, d.node_rank) == (3, 4, 1, 2, 1)


def test_openmpi_and_pmi() -> None:
    d = detect(
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_COMM_WORLD_NODE_RANK": "0",
        }
    )  # a rank on the node, not the node
    assert d is not None and d.launcher == "openmpi" and d.node_rank == 1
    d = detect({"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert d is not None and d.launcher == "pmi" and d.local_world_size == 2


def test_torch_variables_win_over_slurm() -> None:
    d = detect({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "9"})
    assert d is not None and d.launcher == "torchrun" and d.rank == 0


def test_no_launcher() -> None:
    assert detect({"PATH": "/bin"}) is None


def test_inherited_rank_is_not_a_rank() -> None:
    """A DataLoader worker inherits RANK from its rank, which marked it with its own pid."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "_WANDB_FUNNEL_RANK_PID": str(os.getpid() + 1)}
    assert detect(env) is None
    env["_WANDB_FUNNEL_RANK_PID"] = str(os.getpid())
    assert detect(env) is not None
