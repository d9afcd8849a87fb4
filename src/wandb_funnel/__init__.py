"""wandb-funnel: many processes, one wandb run, and an exit that never hangs.

Worker processes push msgpack records through ZeroMQ to one logger process that owns the only
wandb run, orders records by step and rank, reduces across ranks, and always finishes the run.
"""

from __future__ import annotations

from wandb_funnel._api import finish, init, log
from wandb_funnel._options import FunnelOptions
from wandb_funnel._owner.funnel import Funnel
from wandb_funnel._version import __version__
from wandb_funnel._worker.run import Run
from wandb_funnel.errors import (
    ClientClosedError,
    FunnelError,
    FunnelWarning,
    LoggerStartError,
    LoggerUnavailableError,
)

__all__ = [
    "ClientClosedError",
    "Funnel",
    "FunnelError",
    "FunnelOptions",
    "FunnelWarning",
    "LoggerStartError",
    "LoggerUnavailableError",
    "Run",
    "__version__",
    "finish",
    "init",
    "log",
]
