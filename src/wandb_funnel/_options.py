"""The funnel's options: each one defined, documented and validated here, and nowhere else.

``wf.init(**kwargs)`` and ``Funnel(**kwargs)`` take them mixed with ``wandb.init``'s own
arguments: ``FunnelOptions.split`` takes ours out and leaves wandb's. Every entry point
(``wf.init``, ``wf.Funnel``, ``install()``, ``wandb-funnel run``, an installed
``wandb.init``) takes each option by one rule, ``resolve``: its keyword (or flag), else its
``WANDB_FUNNEL_<OPTION>`` variable, else its default. The owner validates them once, at the
call site; the logger process gets them inside its start message
(``_protocol.messages.LoggerStart``) and validates them again, because a message is input.
A process that joins a funnel reads none: the options are the owner's, and what acts in a
rank reaches it from the owner (``_worker.run.AttachInfo``). Only a launched job's ranks
each read the two that decide how they join (``start_timeout``, ``rank_scope``: the same
variables, in every rank of the job).

A plain class, not a dataclass: every worker imports this module, and ``dataclasses`` pulls
in ``inspect`` (a worker's import must stay light; ``tests/test_exports.py`` holds it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from wandb_funnel._constants import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_MAX_LOGGER_RESTARTS,
    DEFAULT_MAX_MEDIA_BYTES,
    DEFAULT_MAX_PENDING_ROWS,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_REORDER_WINDOW,
    DEFAULT_REPLAY_MAX_BYTES,
    DEFAULT_REPLAY_MAX_RECORDS,
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    DEFAULT_STEP_KEY,
    ON_NETWORK_ERROR,
    RANK_SCOPES,
    REDUCERS,
    RESTARTS,
    RUN_MODES,
    TIERS,
)

__all__ = ["FunnelOptions", "PerRankRuns", "Topology", "resolve"]


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"wandb_funnel: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )
    return value


# A number or count of the wrong type is a ValueError, as it always was here (callers that
# pass strings from the environment catch ValueError); a reduce= of the wrong type is a
# TypeError, as it always was.
def _number(name: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"wandb_funnel: {name} must be a number, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"wandb_funnel: {name} must be a positive number, got {value!r}")
    if value < 0:
        raise ValueError(f"wandb_funnel: {name} must be >= 0, got {value!r}")
    return float(value)


def _count(name: str, value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"wandb_funnel: {name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"wandb_funnel: {name} must be >= 1, got {value!r}")
    return value


def _reducers(reduce: Any) -> dict[str, str]:
    """``reduce=``: None, one reducer name for every key, or ``{key or glob: name}``."""
    if reduce is None:
        return {}
    if isinstance(reduce, str):
        reduce = {"*": reduce}
    if not isinstance(reduce, Mapping):
        raise TypeError(
            f"wandb_funnel: reduce must be None, a reducer name or a dict, got "
            f"{type(reduce).__name__}"
        )
    out: dict[str, str] = {}
    for key, name in reduce.items():
        if not isinstance(key, str):
            raise TypeError(f"wandb_funnel: reduce keys must be str, got {key!r}")
        if name not in REDUCERS:
            raise ValueError(
                f"wandb_funnel: unknown reducer {name!r} for key {key!r}; "
                f"choose one of {', '.join(REDUCERS)}"
            )
        out[key] = name
    return out


_FLOATS = ("close_timeout", "start_timeout", "reorder_window", "stall_timeout")
_INTS = (
    "max_pending_rows",
    "max_record_bytes",
    "max_media_bytes",
    "max_logger_restarts",
    "replay_max_records",
    "replay_max_bytes",
)


def parse_option(name: str, text: str) -> Any:
    """One option from text (a flag or an environment variable). ``reduce`` is a reducer
    name for every key, or ``KEY=REDUCER`` pairs separated by commas.

    Raises:
        ValueError: text that is not a number where one is needed, or a malformed pair.
    """
    if name in _FLOATS:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"wandb_funnel: {name} must be a number, got {text!r}") from None
    if name in _INTS:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"wandb_funnel: {name} must be an int, got {text!r}") from None
    if name == "reduce":
        if "=" not in text:
            return text.strip()
        pairs: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, reducer = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(
                    f"wandb_funnel: reduce must be REDUCER or KEY=REDUCER[,KEY=REDUCER...], "
                    f"got {text!r}"
                )
            pairs[key.strip()] = reducer.strip()
        return pairs
    return text


class FunnelOptions:
    """How the funnel merges, orders and closes; everything else goes to ``wandb.init``.

    Args:
        run_mode: ``"auto"`` (a key logged by one rank appears as it is; a key logged by
            several is reduced), ``"shared"`` (every rank's value as ``{key}/rank{rank}``),
            or ``"new"`` (in a launched job: one wandb run per rank, grouped).
        reduce: the reducer per key: ``"mean"``, ``"sum"``, ``"min"``, ``"max"``,
            ``"first"``, ``"concat"`` (tables: one table, rows in rank order), ``"spread"``
            (``key`` the mean, and ``key/min``, ``key/max``, ``key/min_rank``,
            ``key/max_rank``: a rank that is the max 10 steps in a row at 1.2x the median or
            more is reported as a straggler) or ``"merge"``
            (histograms with the same bins: counts added); a dict of key or glob to reducer,
            or one reducer for every key.
            Keys without one are averaged.
        step_key: where a row that cannot take its own ``_step`` (a late row) keeps its
            step; rows at their own step carry nothing of the funnel's.
        close_timeout: seconds that closing may take in all, whatever wandb does.
        start_timeout: seconds to wait for the logger to open the run.
        reorder_window: seconds a row may wait for a straggling rank.
        max_pending_rows: rows held for ordering before the oldest is written anyway.
        max_record_bytes: the largest encoded record ``log()`` accepts.
        max_media_bytes: the largest media item (one image's file, a video) ``log()`` accepts.
        rank_scope: in a launched job on several nodes, ``"global"`` (one run for the job)
            or ``"worker"`` (one per node).
        on_network_error: an online run whose W&B server does not answer within
            ``start_timeout``: ``"offline"`` (the default: the run opens in the background,
            training never waits for it, and if the server still does not answer it is
            recorded offline under the same id, with the ``wandb sync`` command that uploads
            it said on the terminal) or ``"raise"`` (plain ``wandb.init``'s behaviour: the
            start waits for the run and raises ``LoggerStartError`` naming the URL and error).
        stall_timeout: seconds without a new step from any rank (or from one rank while the
            others advance), with the ranks alive, after which the funnel says which rank is
            behind (stderr and the run's console); 0 turns it off. It never kills anything.
        max_logger_restarts: how many times in 10 minutes the owner starts a new logger when
            the logger (or its wandb-core) dies; the run continues, and the ranks resend what
            was not saved. 0: never (the ranks then count what they could not send).
        replay_max_records: the bound, in records, of each rank's replay buffer: records
            sent and not yet saved in the run's transaction log, resent to a restarted
            logger. Past it the oldest are forgotten (never waited for); a restart then
            counts them in ``_funnel/dropped_records``.
        replay_max_bytes: the same bound in bytes of encoded records.
        restarts: a job restarted by torchrun (``--max-restarts``) or requeued by SLURM, or
            run again with the same ``id``: ``"continue"`` (the default: every attempt of
            one training continues one run, ``_attempts.py``) or ``"new"`` (a run per
            attempt, as plain wandb).
        tier: a launched job on several nodes: ``"auto"`` (the default: the node tier when
            the job spans more than one node), ``"node"`` (a node logger on each node other
            than the root's: the node's ranks connect to it locally, and it forwards them to
            the root logger over one connection) or ``"flat"`` (every rank connects to the
            root logger itself).

    Raises:
        ValueError: an option of the wrong type or out of range, named.
        TypeError: ``reduce`` is not None, a str or a dict, or has a key that is not a str.
    """

    __slots__ = (
        "close_timeout",
        "max_logger_restarts",
        "max_media_bytes",
        "max_pending_rows",
        "max_record_bytes",
        "on_network_error",
        "rank_scope",
        "reduce",
        "reorder_window",
        "replay_max_bytes",
        "replay_max_records",
        "restarts",
        "run_mode",
        "stall_timeout",
        "start_timeout",
        "step_key",
        "tier",
    )
    NAMES = frozenset(__slots__)

    run_mode: str
    reduce: dict[str, str]
    step_key: str
    close_timeout: float
    start_timeout: float
    reorder_window: float
    max_pending_rows: int
    max_record_bytes: int
    max_media_bytes: int
    rank_scope: str
    on_network_error: str
    max_logger_restarts: int
    replay_max_records: int
    replay_max_bytes: int
    stall_timeout: float
    restarts: str
    tier: str

    def __init__(
        self,
        *,
        run_mode: str = "auto",
        reduce: Any = None,
        step_key: str = DEFAULT_STEP_KEY,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        reorder_window: float = DEFAULT_REORDER_WINDOW,
        max_pending_rows: int = DEFAULT_MAX_PENDING_ROWS,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES,
        rank_scope: str = "global",
        on_network_error: str = "offline",
        max_logger_restarts: int = DEFAULT_MAX_LOGGER_RESTARTS,
        replay_max_records: int = DEFAULT_REPLAY_MAX_RECORDS,
        replay_max_bytes: int = DEFAULT_REPLAY_MAX_BYTES,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT,
        restarts: str = "continue",
        tier: str = "auto",
    ) -> None:
        self.run_mode = _choice("run_mode", run_mode, RUN_MODES)
        self.reduce = _reducers(reduce)
        if not isinstance(step_key, str) or not step_key:
            raise ValueError(f"wandb_funnel: step_key must be a non-empty str, got {step_key!r}")
        self.step_key = step_key
        self.close_timeout = _number("close_timeout", close_timeout, positive=True)
        self.start_timeout = _number("start_timeout", start_timeout, positive=True)
        self.reorder_window = _number("reorder_window", reorder_window, positive=False)
        self.max_pending_rows = _count("max_pending_rows", max_pending_rows)
        self.max_record_bytes = _count("max_record_bytes", max_record_bytes)
        self.max_media_bytes = _count("max_media_bytes", max_media_bytes)
        self.rank_scope = _choice("rank_scope", rank_scope, RANK_SCOPES)
        self.on_network_error = _choice("on_network_error", on_network_error, ON_NETWORK_ERROR)
        if type(max_logger_restarts) is not int or max_logger_restarts < 0:
            raise ValueError(
                f"wandb_funnel: max_logger_restarts must be an int >= 0, "
                f"got {max_logger_restarts!r}"
            )
        self.max_logger_restarts = max_logger_restarts
        self.replay_max_records = _count("replay_max_records", replay_max_records)
        self.replay_max_bytes = _count("replay_max_bytes", replay_max_bytes)
        self.stall_timeout = _number("stall_timeout", stall_timeout, positive=False)
        self.restarts = _choice("restarts", restarts, RESTARTS)
        self.tier = _choice("tier", tier, TIERS)

    @classmethod
    def split(
        cls, kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> tuple[FunnelOptions, dict[str, Any]]:
        """Our options from ``kwargs`` (over the ``WANDB_FUNNEL_*`` variables: ``resolve``),
        validated, and what is left for ``wandb.init``."""
        ours = {k: v for k, v in kwargs.items() if k in cls.NAMES}
        rest = {k: v for k, v in kwargs.items() if k not in cls.NAMES}
        return cls(**resolve(ours, environ)), rest

    def to_wire(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_wire(cls, data: Any) -> FunnelOptions:
        if not isinstance(data, Mapping) or set(data) != cls.NAMES:
            raise ValueError(f"wandb_funnel: malformed funnel options: {data!r}")
        return cls(**data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FunnelOptions) and self.to_wire() == other.to_wire()

    # Unhashable, like any mutable value object (``reduce`` is a dict).
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_wire().items())
        return f"FunnelOptions({fields})"


def variable(name: str) -> str:
    """The environment variable of option ``name``: ``WANDB_FUNNEL_<NAME>``."""
    return f"WANDB_FUNNEL_{name.upper()}"


def resolve(
    keywords: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The one rule of every entry point (``wf.init``, ``wf.Funnel``, ``install()``,
    ``wandb-funnel run``, an installed ``wandb.init``): each option from its keyword (or
    flag) if given, else from its ``WANDB_FUNNEL_<OPTION>`` variable if set (and not empty),
    else its default. ``reduce`` as a variable is a reducer name for every key, or
    ``KEY=REDUCER`` pairs separated by commas.

    Args:
        keywords: options given as keywords (or flags, already parsed: ``parse_option``);
            returned as given, for ``FunnelOptions(**...)`` to validate.
        environ: the variables (default ``os.environ``). Only those of options not given as
            keywords are read: a variable a keyword overrides is never looked at.

    Returns:
        The options set, as ``FunnelOptions`` keywords; the rest take their defaults.

    Raises:
        ValueError: a variable with a bad value, named with its value (each variable is
            validated on its own, here, at the entry point that reads it).
    """
    environ = os.environ if environ is None else environ
    out = dict(keywords)
    for name in FunnelOptions.__slots__:
        raw = environ.get(variable(name), "")
        if name in out or raw == "":
            continue
        try:
            value = parse_option(name, raw)
            FunnelOptions(**{name: value})  # alone: the error is this variable's
        except (TypeError, ValueError) as exc:
            reason = str(exc).removeprefix("wandb_funnel: ")
            raise ValueError(f"wandb_funnel: {variable(name)}={raw!r}: {reason}") from None
        out[name] = value
    return out


class PerRankRuns(NamedTuple):
    """``run_mode="new"``: each rank's run id and group, from templates over ``{rank}`` and
    ``{local_rank}`` (a rank's index on its node: ``rank - rank_offset``)."""

    id_template: str
    group_template: str
    rank_offset: int

    def names(self, rank: int) -> dict[str, int]:
        return {"rank": rank, "local_rank": rank - self.rank_offset}


class Topology(NamedTuple):
    """Who the job's ranks are, as the launcher knows them. A plain funnel (a Pool, spawned
    processes) knows nothing up front: rank 0 is the owner and ranks are numbered as they
    attach. A launched job (``_launched_init``) knows every rank before any attaches."""

    owner_rank: int = 0
    first_auto_rank: int = 1  # the first rank the logger hands out to a process that asks
    expected_ranks: tuple[int, ...] = ()  # rows wait for these from the start
    tcp_host: str | None = None  # also listen on TCP here (ranks on other nodes)
    per_rank: PerRankRuns | None = None
    # The node tier (issue 38): the root logger's own node; None: flat (no node loggers).
    node: int | None = None

    def to_wire(self) -> dict[str, Any]:
        out = self._asdict()
        out["expected_ranks"] = list(self.expected_ranks)
        out["per_rank"] = list(self.per_rank) if self.per_rank is not None else None
        return out

    @classmethod
    def from_wire(cls, data: Any) -> Topology:
        try:
            per = data["per_rank"]
            topology = cls(
                owner_rank=int(data["owner_rank"]),
                first_auto_rank=int(data["first_auto_rank"]),
                expected_ranks=tuple(int(r) for r in data["expected_ranks"]),
                tcp_host=None if data["tcp_host"] is None else str(data["tcp_host"]),
                per_rank=None
                if per is None
                else PerRankRuns(str(per[0]), str(per[1]), int(per[2])),
                node=None if data.get("node") is None else int(data["node"]),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"wandb_funnel: malformed topology: {data!r}") from exc
        return topology
