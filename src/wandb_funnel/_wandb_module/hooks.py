"""The light end of the install: what runs before wandb is imported.

- ``export``: install into every Python process started from here (the two variables
  ``wandb-funnel run`` and ``install()`` export; ``_bootstrap/sitecustomize.py`` reads them
  in each new process);
- ``prewarm_logger``: start this process's logger as its ``import wandb`` begins.

Its own module, light on purpose: ``wandb-funnel run`` imports it and then replaces itself
with the user's command, and the startup hook imports it in every process that imports
wandb, so whatever it imports is startup time that buys nothing (``install.py`` imports the
API and the owner: 0.1 s).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from wandb_funnel._constants import ENV_INSTALL

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "_bootstrap")


def export(options: Mapping[str, Any]) -> None:
    """Install into every Python process started from now on, with ``options``."""
    os.environ[ENV_INSTALL] = json.dumps(dict(options))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if BOOTSTRAP_DIR not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])


def prewarm_logger() -> None:
    """Start this process's logger ahead of time, as ``import wandb`` begins here
    (``_owner/prewarm.py`` says where that pays)."""
    from wandb_funnel._owner import prewarm

    prewarm.start()
