"""The rendezvous through torch.distributed's store: the only module that imports torch.

The hosting rank publishes how to reach its logger (or why it could not start one) under a
key of the job's store; the other ranks wait for that key with a timeout, so a rank that
fails during init gives everyone else a clear error instead of a hang.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from wandb_funnel._launcher_env import DistEnv
from wandb_funnel.errors import FunnelError, LoggerStartError


class Rendezvous:
    """Keys under ``wandb_funnel/<restart>/<generation>/`` of the job's store."""

    def __init__(self, env: DistEnv, generation: int, timeout: float) -> None:
        self._store = _job_store(env, timeout)
        self._prefix = f"wandb_funnel/{env.restart}/{generation}/"
        self._timeout = timeout

    def publish(self, key: str, value: dict[str, Any]) -> None:
        self._store.set(self._prefix + key, json.dumps(value).encode())

    def claim(self, key: str) -> bool:
        """True for the first caller of the job (any rank, any node) to claim ``key``."""
        return int(self._store.add(self._prefix + key + "/claims", 1)) == 1

    def wait(self, key: str, what: str) -> dict[str, Any]:
        """The value under ``key``; a clear error if it does not come within the timeout."""
        full = self._prefix + key
        try:
            self._store.wait([full], timedelta(seconds=self._timeout))
            value = json.loads(bytes(self._store.get(full)).decode())
        except Exception as exc:  # torch raises DistStoreError / RuntimeError on timeout
            raise LoggerStartError(
                f"wandb_funnel: no {what} appeared in the torch.distributed store within "
                f"{self._timeout:.0f}s (did the hosting rank fail during init?): {exc}"
            ) from exc
        if "error" in value:
            raise LoggerStartError(f"wandb_funnel: the hosting rank failed: {value['error']}")
        return dict(value)


def _job_store(env: DistEnv, timeout: float) -> Any:
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise FunnelError(
            "wandb_funnel: ranks find their logger through torch.distributed; install torch, "
            "or start a Funnel yourself and pass _WANDB_FUNNEL_ADDRESS to every rank"
        ) from exc
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    # Under torchrun the agent already hosts the job's store at MASTER_ADDR:MASTER_PORT.
    if (
        env.master_addr
        and env.master_port
        and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    ):
        return dist.TCPStore(  # type: ignore[attr-defined]
            env.master_addr,
            env.master_port,
            world_size=None,
            is_master=False,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
        )
    raise FunnelError(
        f"wandb_funnel: a {env.launcher} rank without torch.distributed: call "
        f"torch.distributed.init_process_group() before wf.init(), so ranks can find the logger"
    )
