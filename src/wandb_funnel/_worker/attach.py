"""What a process needs to reach a funnel (``AttachInfo``): what a pickled Run carries, and the
``WANDB_FUNNEL_*`` variables that let processes started later attach."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from wandb_funnel._constants import (
    DEFAULT_MAX_MEDIA_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_REPLAY_MAX_BYTES,
    DEFAULT_REPLAY_MAX_RECORDS,
    DEFAULT_STATS_INTERVAL,
    ENV_ADDRESS,
    ENV_CONSOLE,
    ENV_CURVE,
    ENV_HOST,
    ENV_LOGGER_PID,
    ENV_MAX_MEDIA_BYTES,
    ENV_MAX_RECORD_BYTES,
    ENV_REPLAY,
    ENV_RUN_ID,
    ENV_RUN_INFO,
    ENV_STATS_INTERVAL,
    ENV_TOKEN,
)


def _float(text: str | None, default: float) -> float:
    try:
        return float(text) if text else default
    except ValueError:
        return default


def _replay_bound(text: str | None) -> tuple[int, int]:
    records, _, size = (text or "").partition(",")
    size = size.partition(",")[0]
    if records.isdigit() and size.isdigit() and int(records) and int(size):
        return int(records), int(size)
    return DEFAULT_REPLAY_MAX_RECORDS, DEFAULT_REPLAY_MAX_BYTES


class AttachInfo(NamedTuple):
    """Everything a process needs to reach a funnel; what a pickled Run carries."""

    address: str
    token: str
    run_id: str
    max_record_bytes: int
    logger_pid: int | None = None
    logger_host: str | None = None
    curve: dict[str, str] | None = None  # client CURVE keys, when the logger listens on TCP
    run_info: dict[str, Any] | None = None  # the open run's name, project, dir, url, ...
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    console: bool = True  # copy this process's stdout/stderr to the run (console != "off")
    stats_interval: float = DEFAULT_STATS_INTERVAL  # system metrics every so many seconds
    # A rank's replay buffer bound (records, bytes): see FunnelOptions.replay_max_records
    replay: tuple[int, int] = (DEFAULT_REPLAY_MAX_RECORDS, DEFAULT_REPLAY_MAX_BYTES)
    restarts: bool = False  # the owner restarts a logger that dies (max_logger_restarts > 0)

    def to_env(self) -> dict[str, str]:
        """The WANDB_FUNNEL_* variables that let processes started later attach."""
        env = {
            ENV_ADDRESS: self.address,
            ENV_TOKEN: self.token,
            ENV_RUN_ID: self.run_id,
            ENV_MAX_RECORD_BYTES: str(self.max_record_bytes),
            ENV_MAX_MEDIA_BYTES: str(self.max_media_bytes),
            ENV_CONSOLE: "1" if self.console else "0",
            ENV_STATS_INTERVAL: repr(float(self.stats_interval)),
            ENV_REPLAY: f"{self.replay[0]},{self.replay[1]},{int(self.restarts)}",
        }
        if self.logger_pid is not None:
            env[ENV_LOGGER_PID] = str(self.logger_pid)
        if self.logger_host is not None:
            env[ENV_HOST] = self.logger_host
        if self.curve:
            env[ENV_CURVE] = json.dumps(self.curve)
        if self.run_info:
            env[ENV_RUN_INFO] = json.dumps(self.run_info)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AttachInfo | None:
        """The funnel named by WANDB_FUNNEL_* in ``environ``, if any."""
        address = environ.get(ENV_ADDRESS)
        token = environ.get(ENV_TOKEN)
        if not address or token is None:
            return None
        pid = environ.get(ENV_LOGGER_PID, "")
        curve = environ.get(ENV_CURVE)
        run_info = environ.get(ENV_RUN_INFO)
        return cls(
            address=address,
            token=token,
            run_id=environ.get(ENV_RUN_ID, ""),
            max_record_bytes=int(environ.get(ENV_MAX_RECORD_BYTES, DEFAULT_MAX_RECORD_BYTES)),
            logger_pid=int(pid) if pid.isdigit() else None,
            logger_host=environ.get(ENV_HOST),
            curve=json.loads(curve) if curve else None,
            run_info=json.loads(run_info) if run_info else None,
            max_media_bytes=int(environ.get(ENV_MAX_MEDIA_BYTES, DEFAULT_MAX_MEDIA_BYTES)),
            console=environ.get(ENV_CONSOLE, "1") != "0",
            stats_interval=_float(environ.get(ENV_STATS_INTERVAL), DEFAULT_STATS_INTERVAL),
            replay=_replay_bound(environ.get(ENV_REPLAY)),
            restarts=environ.get(ENV_REPLAY, "").endswith(",1"),
        )
