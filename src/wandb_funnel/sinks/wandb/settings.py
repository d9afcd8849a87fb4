"""What the user hands to ``wandb.init`` and what it records of the calling process, as plain
data for the logger's run (which records them as if the owner had called ``wandb.init``).
Knows wandb's rules, never imports wandb: the owner and the workers use it.
"""

from __future__ import annotations

import sys
from typing import Any


def settings_to_dict(settings: Any) -> dict[str, Any]:
    """A ``wandb.Settings`` (or a dict) as the plain dict that travels to the logger."""
    if settings is None:
        return {}
    if isinstance(settings, dict):
        return dict(settings)
    dump = getattr(settings, "model_dump", None)
    if dump is None:
        raise TypeError(
            f"wandb_funnel: settings must be a wandb.Settings or a dict, got "
            f"{type(settings).__name__}"
        )
    # Only what the user set: a dump of everything (or exclude_unset, which still keeps the
    # ~40 computed fields) is refused by the logger's wandb.Settings as extra inputs.
    return dict(dump(include=set(settings.model_fields_set)))


def user_program(start_time: float | None = None) -> dict[str, Any]:
    """What wandb.init would record as this process's program and arguments (wandb's own
    rule: ``__main__.__file__``, or ``-m module``), for the logger's run to record instead of
    its own ``-m wandb_funnel._logger``."""
    import __main__

    program: str | None
    try:
        spec = getattr(__main__, "__spec__", None)
        program = __main__.__file__ if spec is None else f"-m {spec.name}"
    except AttributeError:  # an interactive interpreter: wandb records none either
        program = None
    # wandb.init records in its telemetry which of the libraries it knows its caller has
    # imported (torch, transformers, ...); the logger has imported none of them, so it is
    # told this process's (top-level module names: the logger keeps those wandb knows).
    imports = sorted(name for name in list(sys.modules) if "." not in name)
    return {
        "program": program,
        "args": list(sys.argv[1:]),
        "imports": imports,
        "start_time": start_time,
    }
