"""wandb-funnel: many processes, one wandb run, and an exit that never hangs.

Worker processes push msgpack records through ZeroMQ to one logger process that owns the only
wandb run, orders records by step and rank, reduces across ranks, and always finishes the run.
"""

from __future__ import annotations

import typing as _typing

from ._api import finish, init, log
from ._run import Run
from .errors import (
    ClientClosedError,
    FunnelError,
    FunnelWarning,
    LoggerStartError,
    LoggerUnavailableError,
)

if _typing.TYPE_CHECKING:
    from ._funnel import Funnel

__version__ = "0.1.0"

__all__ = [
    "ClientClosedError",
    "Funnel",
    "FunnelError",
    "FunnelWarning",
    "LoggerStartError",
    "LoggerUnavailableError",
    "Run",
    "__version__",
    "finish",
    "init",
    "log",
]


def __getattr__(name: str) -> object:
    # Only the owner makes a Funnel: a worker's import does not pay for it (subprocess,
    # argparse, secrets, ... about a fifth of the import time). PEP 562.
    if name == "Funnel":
        from ._funnel import Funnel

        return Funnel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
