"""What differs between the wandb releases the funnel supports (0.22 and later), in one place.

Every capability that not every supported wandb has is checked here by feature (a setting
in ``wandb.Settings``' fields, an attribute, a keyword in a signature), never by version
string. Where the installed wandb lacks one, the funnel goes on without it and calls
``degrade(capability, consequence)``: the sink (``run.WandbSink``) says it once on the
logger's terminal and counts it (``_funnel/wandb_degraded``: the capabilities missing;
anything a missing capability costs beyond that is counted where it is lost, as every drop
is). docs/guide/compatibility.md has the table by release.

Imports wandb only inside its functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

# Called with a capability the installed wandb lacks, and what going without it costs.
Degrade = Callable[[str, str], None]


def wandb_version() -> str:
    try:
        import wandb

        return str(wandb.__version__)
    except Exception:  # pragma: no cover - wandb always imports where a sink is open
        return "unknown"


def settings_fields() -> frozenset[str] | None:
    """The names ``wandb.Settings`` accepts (a pydantic model's fields), or None where the
    installed wandb does not say (then every setting is passed as asked)."""
    import wandb

    fields = getattr(wandb.Settings, "model_fields", None)
    return frozenset(fields) if isinstance(fields, dict) else None


# The settings the funnel sets on its own run where the user did not, with what the run
# loses on a wandb that lacks one.
_FUNNEL_SETTINGS: dict[str, str] = {
    "x_transaction_log_flush_interval": (
        "its transaction log reaches disk in whole 32 KiB blocks, not every 0.2 s: ranks "
        "hear their records are saved only as each block is written, and keep them to "
        "replay until then (within replay_max_records / replay_max_bytes)"
    ),
    "x_stats_pid": (
        "wandb-core samples the logger's process for the run's proc.* system metrics, not "
        "the training process's"
    ),
}


def add_funnel_settings(settings: dict[str, Any], wanted: dict[str, Any], degrade: Degrade) -> None:
    """Set each of ``wanted`` in ``settings`` (the run's, as a dict) unless the user set it,
    where the installed wandb has that setting; one it lacks is left out and degraded."""
    fields = settings_fields()
    for name, value in wanted.items():
        if name in settings:
            continue
        if fields is not None and name not in fields:
            degrade(f"setting {name}", _FUNNEL_SETTINGS.get(name, "left unset"))
            continue
        settings[name] = value


def _takes(function: Any, keyword: str) -> bool:
    # Per console line for _publish_output_raw: the signature is read once per function.
    return _signature_takes(getattr(function, "__func__", function), keyword)


@functools.lru_cache(maxsize=64)
def _signature_takes(function: Any, keyword: str) -> bool:
    import inspect

    try:
        return keyword in inspect.signature(function).parameters
    except (TypeError, ValueError):  # no signature to read: pass it, as asked
        return True


def interface(run: Any) -> Any:
    """The run's interface to wandb-core (``Run._interface`` from wandb 0.26.1, before it
    ``Run._backend.interface``), or None where neither is there (degraded by the caller)."""
    found = getattr(run, "_interface", None)
    if found is None:
        found = getattr(getattr(run, "_backend", None), "interface", None)
    return found


def publish_output_raw(run: Any, record: Any, degrade: Degrade) -> bool:
    """Publish a console record, waiting for it to be queued (``nowait=False``, the default
    of the wandb releases that have the keyword: 0.22.3 and later). False: no interface."""
    found = interface(run)
    publish = getattr(found, "_publish_output_raw", None)
    if publish is None:
        degrade(
            "interface to publish console records",
            "the ranks' console output is counted as dropped, not written to output.log",
        )
        return False
    if _takes(publish, "nowait"):
        publish(record, nowait=False)
    else:
        publish(record)
    return True


def publish_stats(run: Any, data: dict[str, Any], degrade: Degrade) -> bool:
    """Publish a system-metrics record. False: no interface (degraded, and the caller counts
    the record as not written)."""
    publish = getattr(interface(run), "publish_stats", None)
    if publish is None:
        degrade(
            "interface to publish stats records",
            "the ranks' system metrics are left out of the run",
        )
        return False
    publish(data)
    return True


def save(run: Any, path: str, base_path: str, policy: str, expand: bool) -> None:
    """``run.save(path, base_path=..., policy=..., glob=expand)``. Before wandb 0.28.1
    ``save`` has no ``glob`` and always expands: a literal path is escaped for it, so it
    matches the one file it names (``[`` in a name, say)."""
    if _takes(run.save, "glob"):
        run.save(path, base_path=base_path, policy=policy, glob=expand)
        return
    import glob

    run.save(path if expand else glob.escape(path), base_path=base_path, policy=policy)


def run_method_takes(method: str, keyword: str) -> bool:
    """Whether the installed wandb's ``Run.<method>`` has ``keyword`` (``define_metric``'s
    ``goal`` went in wandb 0.29). True where wandb cannot be imported: nothing to check."""
    try:
        from wandb.sdk.wandb_run import Run
    except ImportError:
        return True
    return _takes(getattr(Run, method, None), keyword)
