"""What a ``Funnel`` is asked for, checked and prepared at the call site before anything
starts: the funnel's options (each from its keyword, else its ``WANDB_FUNNEL_<OPTION>``
variable, else its default: ``_options.resolve``), the job's ranks, and ``wandb.init``'s
arguments as plain data for the logger, with the run's id and what every rank is told of the
user's wandb settings (console capture, system metrics): what every rank is told of them."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any, NamedTuple

from wandb_funnel import _attempts
from wandb_funnel._constants import DEFAULT_STATS_INTERVAL
from wandb_funnel._options import FunnelOptions, Topology
from wandb_funnel._worker.attach import AttachInfo
from wandb_funnel._worker.run_data import jsonable, parse_config
from wandb_funnel.sinks import Backend


class RunRequest(NamedTuple):
    options: FunnelOptions
    topology: Topology
    init_kwargs: dict[str, Any]  # plain JSON data for the logger's wandb.init, with "id"
    console: bool  # every rank's console goes to the run (unless the user said "off")
    stats_interval: float  # seconds between each rank's system metrics samples (0: off)
    attempt: dict[str, Any] | None  # this run as an attempt of a job (_attempts.Attempt)

    @property
    def run_id(self) -> str:
        return str(self.init_kwargs["id"])

    def attach_info(
        self,
        address: str,
        token: str,
        logger_pid: int | None,
        curve: dict[str, str] | None,
        run_info: dict[str, Any] | None,
    ) -> AttachInfo:
        """What every rank is told of this funnel: how to reach it (``address``, ``token``,
        ``curve``: the client's keys), and the owner's options and settings that act in a
        rank (a rank that attaches reads none of its own)."""
        options = self.options
        return AttachInfo(
            address,
            token,
            self.run_id,
            options.max_record_bytes,
            logger_pid,
            socket.gethostname(),
            curve,
            run_info,
            options.max_media_bytes,
            self.console,
            self.stats_interval,
            (options.replay_max_records, options.replay_max_bytes),
            options.max_logger_restarts > 0,
        )


def prepare(
    options: FunnelOptions | None,
    topology: Topology | None,
    kwargs: Mapping[str, Any],
    sink: Backend,
) -> RunRequest:
    """``Funnel(options, topology=..., **kwargs)``'s arguments, checked.

    Args:
        options: the options as one object, complete (the variables are not read), or
            None: then they are taken out of ``kwargs``, over the variables.
        topology: the job's ranks, as a launcher knows them (None: a plain funnel).
        kwargs: funnel options (when ``options`` is None) and ``wandb.init`` arguments.
        sink: the sink's owner side, which makes the run's id and converts its settings.

    Raises:
        TypeError, ValueError: a bad option (a variable's named with its value), topology or
            ``wandb.init`` argument, named.
    """
    if options is None:
        options, kwargs = FunnelOptions.split(kwargs)
    elif not isinstance(options, FunnelOptions):
        raise TypeError(f"wandb_funnel: options must be a FunnelOptions, got {options!r}")
    elif FunnelOptions.NAMES & kwargs.keys():
        raise TypeError(
            f"wandb_funnel: {', '.join(sorted(FunnelOptions.NAMES & kwargs.keys()))} "
            f"given both in options and as keywords"
        )
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"wandb_funnel: topology must be a Topology, got {topology!r}")
    wandb_init_kwargs = dict(kwargs)
    if wandb_init_kwargs.get("id") is not None and not isinstance(wandb_init_kwargs["id"], str):
        raise TypeError(f"wandb_funnel: id must be a str, got {wandb_init_kwargs['id']!r}")
    if wandb_init_kwargs.get("id") is None and os.environ.get("WANDB_RUN_ID"):
        # wandb's own rule: WANDB_RUN_ID names the run when init() is given no id.
        wandb_init_kwargs["id"] = os.environ["WANDB_RUN_ID"]
    # One run across a job's restarts: the run this attempt continues (or a new one).
    attempt = _attempts.plan(wandb_init_kwargs, options.restarts)
    if wandb_init_kwargs.get("id") is None:
        wandb_init_kwargs["id"] = attempt.run_id if attempt else sink.run_id()
    if attempt is not None and attempt.continues and wandb_init_kwargs.get("resume") is None:
        wandb_init_kwargs["resume"] = "allow"
    init_kwargs = _portable_init_kwargs(wandb_init_kwargs, sink)
    settings = init_kwargs.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    # Every rank's console goes to the run unless the user said console="off".
    console = settings.get("console") != "off" and os.environ.get("WANDB_CONSOLE") != "off"
    return RunRequest(
        options,
        topology or Topology(),
        init_kwargs,
        console,
        _stats_interval(settings),
        attempt.to_wire() if attempt else None,
    )


def _stats_interval(settings: dict[str, Any]) -> float:
    """Seconds between system metrics samples, as the user's wandb settings say (0: off)."""
    disabled = settings.get("x_disable_stats", os.environ.get("WANDB_X_DISABLE_STATS", ""))
    if disabled is True or str(disabled).lower() in ("1", "true"):
        return 0.0
    raw = settings.get(
        "x_stats_sampling_interval", os.environ.get("WANDB_X_STATS_SAMPLING_INTERVAL")
    )
    try:
        return float(raw) if raw is not None else DEFAULT_STATS_INTERVAL
    except (TypeError, ValueError):
        return DEFAULT_STATS_INTERVAL


def _portable_init_kwargs(kwargs: dict[str, Any], sink: Backend) -> dict[str, Any]:
    """wandb.init kwargs as plain JSON data for the logger process (no pickle anywhere)."""
    out = {k: v for k, v in kwargs.items() if v is not None}  # wandb: None means "not set"
    if "settings" in out:
        out["settings"] = sink.settings(out["settings"])
    if "config" in out:
        out["config"] = {str(k): jsonable(v) for k, v in parse_config(out["config"]).items()}
    for key in ("dir", "tags"):  # a PathLike dir, a tuple of tags
        if isinstance(out.get(key), os.PathLike):
            out[key] = os.fspath(out[key])
        elif isinstance(out.get(key), (tuple, set, frozenset)):
            out[key] = list(out[key])
    for key, value in out.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"wandb_funnel: wandb.init argument {key}= must be plain data (dict, list, str, "
                f"number, bool, None) to reach the logger process: {exc}"
            ) from exc
    return out
