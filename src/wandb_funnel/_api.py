"""The module-level API: ``wf.init``, ``wf.log``, ``wf.finish`` and this process's current Run."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from typing import Any

from wandb_funnel import _current, _init_keywords
from wandb_funnel._constants import ENV_RANK_PID, WELCOME_TIMEOUT
from wandb_funnel._launched_init import init_launched
from wandb_funnel._launcher_env import detect as detect_dist_env
from wandb_funnel._launcher_env import from_process_group
from wandb_funnel._options import FunnelOptions
from wandb_funnel._owner.funnel import Funnel
from wandb_funnel._worker.run import AttachInfo, Run
from wandb_funnel._worker.run_data import parse_config
from wandb_funnel.errors import FunnelWarning


def current_run() -> Run | None:
    """This process's current, unfinished Run (never one inherited through fork)."""
    return _current.get()


def _env_rank() -> int | None:
    """``RANK`` from the launcher, unless it was inherited from a parent that already used it."""
    value = os.environ.get("RANK")
    if value is None:
        return None
    owner = os.environ.get(ENV_RANK_PID)
    if owner is not None and owner != str(os.getpid()):
        return None  # a DataLoader worker or Pool child of a rank: it gets a rank of its own
    try:
        rank = int(value)
    except ValueError:
        raise ValueError(f"wandb_funnel: RANK must be an integer, got {value!r}") from None
    os.environ[ENV_RANK_PID] = str(os.getpid())
    return rank


def attach_info_from_env() -> AttachInfo | None:
    return AttachInfo.from_env(os.environ)


def alone_in_a_child() -> bool:
    """A multiprocessing child with no funnel around it (started before its parent's
    ``wandb.init``, as in wandb's cross-validation example) and no job of its own (no
    launcher, no process group): nothing for a funnel to join, so an installed
    ``wandb.init`` there is plain wandb's, as its result would be (issue 34: a private
    funnel in each of 5 children cost 25.5 s against plain's 6.6)."""
    if multiprocessing.parent_process() is None or attach_info_from_env() is not None:
        return False
    env = detect_dist_env() or from_process_group()
    return env is None or env.world_size <= 1


def init(*, rank: int | None = None, **wandb_init_kwargs: Any) -> Run:
    """Attach this process to the funnel it can see, or start a private one.

    Takes ``wandb.init``'s keywords, as wandb does (a ``None`` value means "not set"), mixed
    with the funnel's options (``FunnelOptions``: each from its keyword, else its
    ``WANDB_FUNNEL_<OPTION>`` variable, else its default; they act where this process starts
    the funnel, and are the owner's where it attaches). In a process started after a Funnel (it
    finds ``_WANDB_FUNNEL_ADDRESS``), this attaches as a rank: ``rank`` if given, else ``RANK``
    from the environment, else the next one the logger assigns. ``config=`` is applied to the
    run; other wandb.init arguments belong to the owner and are ignored with a warning. With no
    funnel around it starts a private one, so a single-process script works exactly like
    ``wandb.init``. While this process has an unfinished Run, ``init`` returns it (updating
    its config), unless ``reinit="finish_previous"`` (or ``True``) finishes it first.

    Raises:
        TypeError, ValueError: bad arguments (a variable's: named with its value), named.
        LoggerStartError: a private funnel could not open its run.
    """
    return open_run(rank, wandb_init_kwargs)


def open_run(
    rank: int | None, wandb_init_kwargs: dict[str, Any], first_caller_hosts: bool = False
) -> Run:
    """``init``'s body. ``first_caller_hosts``: in a launched job, the first rank to call
    hosts the funnel, not rank 0 (an installed ``wandb.init``: see ``init_launched``)."""
    if rank is not None and (type(rank) is not int or rank < 0):
        raise ValueError(f"wandb_funnel: rank must be a non-negative int, got {rank!r}")
    for name in ("options", "topology"):  # Funnel's own parameters, not init()'s
        if name in wandb_init_kwargs:
            raise TypeError(
                f"wandb_funnel: init() takes the funnel's options as keywords, not {name}="
            )
    kwargs = {k: v for k, v in wandb_init_kwargs.items() if v is not None}
    reinit = kwargs.pop("reinit", None)
    config = _init_config(kwargs)
    # Keywords that would patch the logger, not this process (an installed wandb.init has
    # taken them out already, and acts on them here): warned and counted.
    local = _init_keywords.take_local(kwargs)
    run = _open(rank, kwargs, config, reinit, first_caller_hosts)
    _init_keywords.unsupported_here(
        run,
        local,
        "through wf.init does not act in this process: use wandb_funnel.install() "
        "(or wandb-funnel run) and wandb.init",
    )
    return run


def _open(
    rank: int | None,
    kwargs: dict[str, Any],
    config: dict[str, Any],
    reinit: Any,
    first_caller_hosts: bool,
) -> Run:
    with _current.lock:
        run = _current.get()
        if run is not None and reinit in (True, "finish_previous"):
            run.finish()
            _current.forget(run)
            run = None
        if run is not None:
            _warn_ignored(kwargs, _RETURNED, run)
            run.config.update(config, allow_val_change=True)
            return run
        if config:
            kwargs["config"] = config
        run = _new_run(rank, kwargs, first_caller_hosts)
        # A run this process opened has the config already (its mirror too: nothing is sent
        # again); a rank that attached sends it.
        run.config.update(config, allow_val_change=True)
        _current.use(run)
        return run


def _new_run(rank: int | None, kwargs: dict[str, Any], first_caller_hosts: bool) -> Run:
    info = attach_info_from_env()
    if info is None and rank is None:
        env = detect_dist_env() or from_process_group()
        if env is not None and env.world_size > 1:
            options, wandb_kwargs = FunnelOptions.split(kwargs)
            return init_launched(env, options, wandb_kwargs, first_caller_hosts)
    if info is None:
        # No funnel around (a child started before its parent's, as in wandb's
        # cross-validation example): a run of its own, as plain wandb.init makes one there.
        # Nothing is said: the result is plain's (issue 34 found the warning once a child).
        own = Funnel(**kwargs).start().run
        own._attach(WELCOME_TIMEOUT)  # as after wandb.init: its prints reach the run from here
        return own
    run = Run(info, requested_rank=rank if rank is not None else _env_rank())
    # Like wandb.init, init() returns once the run knows us: the logger then holds
    # rows for this rank, so ranks that sync after init (a barrier) merge at step 0.
    if not run._attach(WELCOME_TIMEOUT):
        warnings.warn(
            f"wandb-funnel: the logger at {info.address} did not answer within "
            f"{WELCOME_TIMEOUT}s; logging anyway (records are buffered, then counted "
            f"if dropped)",
            FunnelWarning,
            stacklevel=3,
        )
    _warn_ignored({k: v for k, v in kwargs.items() if k != "config"}, _ATTACHED, run)
    return run


def _init_config(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``config=`` of wandb.init, with ``config_include_keys`` / ``config_exclude_keys``
    applied (all three taken out of ``kwargs``), keys and values as wandb stores them."""
    config = parse_config(kwargs.pop("config", None))
    kwargs.pop("allow_val_change", None)  # init's config is applied as given, as wandb does
    include = kwargs.pop("config_include_keys", None)
    exclude = kwargs.pop("config_exclude_keys", None)
    if include is not None and exclude is not None:
        raise ValueError(
            "wandb_funnel: config_include_keys and config_exclude_keys are mutually exclusive"
        )
    if include is not None:
        config = {k: v for k, v in config.items() if k in include}
    if exclude is not None:
        config = {k: v for k, v in config.items() if k not in exclude}
    return config


_ATTACHED = "attached to an existing funnel; these arguments belong to its owner"
_RETURNED = 'returned this unfinished run (reinit="finish_previous" starts a new one)'


# Keywords a framework passes again to the run it means to continue (Lightning's WandbLogger
# in a ddp_spawn rank: id=, resume="allow", its project, name and dir): nothing is lost in
# ignoring them when they name the funnel's run, so nothing is said.
_CONTINUING = frozenset({"resume", "reinit", "anonymous", "allow_val_change", "resume_from"})
_RUN_NAMES = ("id", "name", "project", "entity", "group", "job_type")


def _agrees(key: str, value: Any, run: Run) -> bool:
    """``key=value`` of a wandb.init asks for what the funnel's run already is."""
    if key in _CONTINUING:
        return True
    if key in _RUN_NAMES:
        return bool(value == (run.id if key == "id" else run._run_info(key)))
    if key == "dir" and isinstance(value, (str, os.PathLike)):
        run_dir = str(run._run_info("dir") or "")
        return bool(run_dir) and run_dir.startswith(os.path.abspath(os.fspath(value)))
    return False


def _warn_ignored(kwargs: dict[str, Any], why: str, run: Run | None = None) -> None:
    ignored = sorted(
        k
        for k, v in kwargs.items()
        if k not in FunnelOptions.NAMES and not (run is not None and _agrees(k, v, run))
    )
    if ignored:
        warnings.warn(
            f"wandb-funnel: init() {why}, and ignored: {', '.join(ignored)}",
            FunnelWarning,
            stacklevel=4,
        )


def _mark_launcher_rank() -> None:
    """A launcher's rank marks itself as soon as wandb_funnel is imported, so that every
    process it starts afterwards (DataLoader workers, a Pool), even before wf.init, knows it
    inherited RANK rather than being a rank of the job."""
    if detect_dist_env() is not None and ENV_RANK_PID not in os.environ:
        os.environ[ENV_RANK_PID] = str(os.getpid())


_mark_launcher_rank()


def log(data: dict[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """Log through this process's current Run, attaching on first use (see ``Run.log``)."""
    run = _current.get()
    if run is None:
        run = init()
    run.log(data, step=step, commit=commit)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """Finish this process's current Run, if any (the owner's: close the funnel)."""
    run = _current.get()
    if run is not None:
        run.finish(exit_code)
        _current.forget(run)
