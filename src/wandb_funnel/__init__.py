"""wandb-funnel: many processes, one wandb run, and an exit that never hangs.

Worker processes push msgpack records through ZeroMQ to one logger process that owns the only
wandb run, orders records by step and rank, reduces across ranks, and always finishes the run.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from wandb_funnel._version import __version__
from wandb_funnel.errors import (
    ClientClosedError,
    FunnelError,
    FunnelWarning,
    LoggerStartError,
    LoggerUnavailableError,
)

if _typing.TYPE_CHECKING:
    from wandb_funnel._api import finish, init, log
    from wandb_funnel._options import FunnelOptions
    from wandb_funnel._owner.funnel import Funnel
    from wandb_funnel._worker.media import Histogram, Image, Table
    from wandb_funnel._worker.run import Run


def __getattr__(name: str) -> _typing.Any:
    """The rest of the public names, imported on first use (PEP 562): `wandb-funnel run` and
    every process's startup hook import this package, and neither needs zmq, the codec or
    the owner to start (0.1 s of `wandb-funnel run`'s startup, benchmarks/startup.py)."""
    if name in ("finish", "init", "log"):
        module = _importlib.import_module("wandb_funnel._api")
    elif name == "FunnelOptions":
        module = _importlib.import_module("wandb_funnel._options")
    elif name == "Funnel":
        module = _importlib.import_module("wandb_funnel._owner.funnel")
    elif name in ("Histogram", "Image", "Table"):
        module = _importlib.import_module("wandb_funnel._worker.media")
    elif name == "Run":
        module = _importlib.import_module("wandb_funnel._worker.run")
    else:
        raise AttributeError(f"module 'wandb_funnel' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value  # once: later lookups never reach __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(
        {
            *globals(),
            "finish",
            "init",
            "log",
            "FunnelOptions",
            "Funnel",
            "Histogram",
            "Image",
            "Table",
            "Run",
        }
    )


def install(**funnel_options: object) -> None:
    """Route the ``wandb`` module through the funnel, here and in every process started from
    here: ``wandb.init`` (yours, or HF's, Lightning's, accelerate's) then returns a funnel Run,
    and ``wandb.run``, ``config``, ``summary``, ``log``, ``define_metric``, ... follow it.

    One line at the top of a script, before or after ``import wandb``. Idempotent.
    ``funnel_options`` are ``FunnelOptions`` (``run_mode``, ``reduce``, ...).

    Raises:
        ValueError, TypeError: a bad option, named.
    """
    # Here, not at the top: it imports wandb, which a worker that only logs never needs.
    from wandb_funnel._wandb_module.install import install as install_into_wandb

    install_into_wandb(**funnel_options)


def uninstall() -> None:
    """Put the ``wandb`` module back as it was, here and for processes started from now on."""
    from wandb_funnel._wandb_module.install import uninstall as uninstall_from_wandb

    uninstall_from_wandb()


__all__ = [
    "ClientClosedError",
    "Funnel",
    "FunnelError",
    "FunnelOptions",
    "FunnelWarning",
    "Histogram",
    "Image",
    "LoggerStartError",
    "LoggerUnavailableError",
    "Run",
    "Table",
    "__version__",
    "finish",
    "init",
    "install",
    "log",
    "uninstall",
]
