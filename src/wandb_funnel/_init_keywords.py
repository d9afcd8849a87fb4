"""``wandb.init``'s keywords that make wandb patch or watch the *calling* process.

The funnel's run is opened by ``wandb.init`` in the logger process, so such a keyword passed
on would patch the logger (which writes no tensorboard events and runs no gym environment)
and do nothing for the process that asked: silently nothing. They are taken out of the
arguments here, before the run is opened, and acted on in the calling process:

- ``sync_tensorboard`` (and its old name ``tensorboard``; ``settings.sync_tensorboard``;
  ``WANDB_SYNC_TENSORBOARD``): installed, this process's tensorboard writers are patched by
  wandb's own patch, which hands each log directory to ``wandb.run._tensorboard_callback``:
  the funnel's Run sends it to the logger, whose run then reads the tfevents files from disk
  as plain wandb's does (``tbrecord``). Through ``wf.init`` (wandb's module not installed,
  so wandb's patch would not find the funnel's run): warned once and counted.
- ``monitor_gym``: installed, wandb's own gym patch in this process; its videos are logged
  through ``wandb.log``, which is the funnel's. Through ``wf.init``: warned and counted.
- ``settings.capture_loggers``: wandb attaches its handlers to the calling process's loggers;
  the logger process has none of the user's: warned and counted (their records still reach
  the run's console when a handler writes them to stdout or stderr, as the funnel captures
  every rank's console).
- In a Jupyter notebook wandb hooks the notebook's display and saves the notebook as the
  run's code; the logger process is not the notebook: warned and counted (``notebook``).

Imports nothing heavy: every worker imports ``_api``, which uses this module.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_TRUE = ("1", "true", "t", "yes", "y", "on")


def _truthy(value: Any) -> bool:
    return value.strip().lower() in _TRUE if isinstance(value, str) else bool(value)


def _settings_dict(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``kwargs["settings"]`` as a dict of what the user set (a ``wandb.Settings`` is
    converted, and put back as the dict), or None when there are none."""
    settings = kwargs.get("settings")
    if settings is None:
        return None
    if not isinstance(settings, dict):
        from wandb_funnel.sinks.wandb.settings import settings_to_dict

        settings = settings_to_dict(settings)
    kwargs["settings"] = settings = dict(settings)
    return settings


def take_local(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the keywords that act in the calling process out of ``kwargs`` (wandb.init's
    arguments, ``None`` already meaning unset); returns them as ``{"sync_tensorboard": True,
    "monitor_gym": True, "capture_loggers": {...}}``, only those asked for."""
    local: dict[str, Any] = {}
    settings = _settings_dict(kwargs) or {}
    tensorboard = [kwargs.pop(k) for k in ("tensorboard", "sync_tensorboard") if k in kwargs]
    if "sync_tensorboard" in settings:
        tensorboard.insert(0, settings.pop("sync_tensorboard"))
    if not tensorboard and os.environ.get("WANDB_SYNC_TENSORBOARD"):
        tensorboard.append(os.environ["WANDB_SYNC_TENSORBOARD"])
    if tensorboard and _truthy(tensorboard[-1]):  # wandb: the keyword over the old name
        local["sync_tensorboard"] = True
    if _truthy(kwargs.pop("monitor_gym", False)):
        local["monitor_gym"] = True
    loggers = settings.pop("capture_loggers", None)
    if loggers:
        local["capture_loggers"] = loggers
    if _in_notebook():
        local["notebook"] = True
    return local


def _in_notebook() -> bool:
    """A Jupyter kernel (its IPython shell is a ZMQInteractiveShell), without importing
    IPython where it is not loaded already."""
    get = getattr(sys.modules.get("IPython"), "get_ipython", None)
    try:
        shell = get() if get is not None else None
    except Exception:  # wandb's own check guards this call too
        return False
    return type(shell).__name__ == "ZMQInteractiveShell"


def unsupported_here(run: Any, local: dict[str, Any], how: str) -> None:
    """Warn once and count (``_funnel/unsupported_calls``) each keyword of ``local`` that
    cannot act in this process (``how`` says why)."""
    for name in local:
        run._unsupported(f"init-{name}", f"wandb.init({name}=...) {how}")
