"""A module that logs when a multiprocessing child imports it: the target of
``pool.py child-logs-while-unpickled``. A child imports it while unpickling its Process
object, before (for forkserver) multiprocessing's bootstrap clears the finalizer registry.
The owner sets OWNER_PID before it imports this module, and does not log from it."""

from __future__ import annotations

import os

import wandb_funnel as wf

if os.getpid() != int(os.environ["OWNER_PID"]):  # a child, not the owner
    for i in range(10):
        wf.log({"at_import": i}, step=i)


def target() -> None:
    pass
