"""``wandb_funnel.install()``: the real ``wandb`` module's run API goes through the funnel.

After ``install()``, ``wandb.init`` (whoever calls it: the user's script, HF's
``WandbCallback``, Lightning's ``WandbLogger``, accelerate's tracker) returns a funnel Run,
and ``wandb.run``, ``wandb.config``, ``wandb.summary``, ``wandb.log``, ``wandb.define_metric``,
... point at it until it is finished, exactly where wandb itself puts them
(``wandb.sdk.lib.module.set_global``). Everything else of wandb (``wandb.Settings``,
``wandb.Api``, the data types, ``wandb.sdk.*``, ``termlog``) is untouched.

It holds in every process started from this one: ``install()`` exports ``_WANDB_FUNNEL_INSTALL``
(the options, as JSON) and puts ``_bootstrap/`` on ``PYTHONPATH``, whose ``sitecustomize``
installs again, lazily, when such a process imports wandb (``_bootstrap/sitecustomize.py``).
The logger process is started without the variable: it calls the real wandb.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from wandb_funnel import _api, _current, _init_keywords
from wandb_funnel._constants import ENV_INSTALL, ORIGINAL_ATTRIBUTE
from wandb_funnel._options import FunnelOptions, resolve
from wandb_funnel._owner import prewarm
from wandb_funnel._wandb_module.hooks import BOOTSTRAP_DIR, export
from wandb_funnel._wandb_module.wandb_run import as_installed
from wandb_funnel._worker.run import Run

# The module attributes wandb.init sets to the run's methods (wandb.sdk.lib.module.set_global),
# and that it puts back to pre-init stubs on finish.
_RUN_GLOBALS = (
    "log",
    "save",
    "use_artifact",
    "log_artifact",
    "define_metric",
    "alert",
    "mark_preempting",
    "log_model",
    "use_model",
    "link_model",
    "watch",
    "unwatch",
)
_STATE_GLOBALS = ("run", "config", "summary")
_FUNCTIONS = ("init", "finish", "login")

_lock = threading.RLock()
_installed: _Installed | None = None


class _Installed:
    """What install() changed, to put back."""

    def __init__(self, wandb: Any, options: dict[str, Any], base: dict[str, Any]) -> None:
        self.wandb = wandb
        self.options = options
        self.base = base  # what was exported to this process before install()
        self.originals: dict[str, Any] = {
            name: getattr(wandb, name) for name in (*_FUNCTIONS, *_STATE_GLOBALS, *_RUN_GLOBALS)
        }
        self.init_signature = inspect.signature(self.originals["init"])


def exported_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """What ``install()`` or ``wandb-funnel run`` exported (``_WANDB_FUNNEL_INSTALL``, JSON:
    their keywords and flags, and the ``WANDB_FUNNEL_*`` variables they read), as keywords."""
    raw = environ.get(ENV_INSTALL, "")
    if raw in ("", "1"):
        return {}
    try:
        options = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"wandb_funnel: {ENV_INSTALL} is not JSON: {raw!r:.80}") from exc
    if not isinstance(options, dict):
        raise ValueError(f"wandb_funnel: {ENV_INSTALL} must be a JSON object, got {raw!r:.80}")
    return options


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The funnel options for an installed process: what was exported to it, over the
    ``WANDB_FUNNEL_<OPTION>`` variables (``_options.resolve``)."""
    environ = os.environ if environ is None else environ
    return resolve(exported_options(environ), environ)


def install(**funnel_options: Any) -> None:
    """Route the ``wandb`` module's run API through the funnel, in this process and in every
    process started from it. Idempotent; calling it again with options replaces them.

    Args:
        **funnel_options: the funnel's options (``FunnelOptions``: ``run_mode``, ``reduce``,
            ...), used when a ``wandb.init`` here starts or hosts the funnel; over what
            ``wandb-funnel run`` exported, over the ``WANDB_FUNNEL_*`` variables.

    Raises:
        ValueError, TypeError: a bad option (a variable's: named with its value), named
            (checked now, not at ``wandb.init``).
    """
    global _installed
    # Over what `wandb-funnel run` (or an installed parent) exported before the first
    # install() here (a second call replaces its options), over WANDB_FUNNEL_*.
    base = _installed.base if _installed is not None else exported_options(os.environ)
    options = resolve({**base, **funnel_options})
    FunnelOptions(**options)  # validated at the call site
    if "wandb" not in sys.modules:  # the logger imports wandb beside this import
        prewarm.start()
    import wandb

    with _lock:
        if _installed is None:
            _installed = _Installed(wandb, options, base)
            _patch(wandb)
        else:
            _installed.options = options
        export(options)


def install_into(wandb: Any) -> None:
    """Install with the exported options into ``wandb``, just imported in a process started
    from an installed one (``_bootstrap/sitecustomize.py``)."""
    global _installed
    with _lock:
        if _installed is None:
            options = options_from_env()
            FunnelOptions(**options)
            _installed = _Installed(wandb, options, exported_options(os.environ))
            _patch(wandb)


def uninstall() -> None:
    """Put the ``wandb`` module back as it was (a funnel run still open stays open: finish it
    with ``wandb_funnel.finish()``), and stop installing into processes started from here."""
    global _installed
    with _lock:
        state, _installed = _installed, None
        if state is None:
            return
        for name, value in state.originals.items():
            setattr(state.wandb, name, value)
        # Not what was there before install(): `wandb-funnel run` may have exported it.
        os.environ.pop(ENV_INSTALL, None)
        parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        kept = [p for p in parts if p and p != BOOTSTRAP_DIR]
        if kept:
            os.environ["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            os.environ.pop("PYTHONPATH", None)


def is_installed() -> bool:
    return _installed is not None


def _mark(function: Callable[..., Any], original: Any) -> Callable[..., Any]:
    setattr(function, ORIGINAL_ATTRIBUTE, original)
    function.__doc__ = getattr(original, "__doc__", None)
    return function


def _patch(wandb: Any) -> None:
    assert _installed is not None
    originals = _installed.originals
    wandb.init = _mark(_init, originals["init"])
    wandb.finish = _mark(_finish, originals["finish"])
    wandb.login = _mark(_login, originals["login"])


# -- the functions put on the wandb module ---------------------------------------------------
def _init(*args: Any, **kwargs: Any) -> Any:
    """wandb.init, through the funnel (the real one's docstring is below)."""
    state = _installed
    if state is None:  # uninstalled while a library held on to this function
        return _real("init")(*args, **kwargs)
    bound = state.init_signature.bind_partial(*args, **kwargs)
    arguments = {k: v for k, v in bound.arguments.items() if v is not None}
    arguments.update(arguments.pop("kwargs", None) or {})
    mode = arguments.get("mode") or os.environ.get("WANDB_MODE")
    if mode == "disabled" or (
        arguments.get("settings") is not None and _disabled(arguments["settings"])
    ):
        return state.originals["init"](*args, **kwargs)  # nothing to funnel: wandb's no-op run
    if _api.alone_in_a_child():
        # Plain wandb's own run, as in a process with nothing to funnel; offline unless
        # asked otherwise, as the funnel's runs are.
        if "mode" not in arguments and "WANDB_MODE" not in os.environ:
            kwargs["mode"] = "offline"  # as sinks/wandb/run.py defaults the funnel's runs
        return state.originals["init"](*args, **kwargs)
    if mode == "dryrun":
        arguments["mode"] = "offline"
    if isinstance(arguments.get("config"), str):  # a YAML file, as wandb reads it
        from wandb.sdk.lib import config_util

        arguments["config"] = config_util.dict_from_config_file(arguments["config"])
    local = _init_keywords.take_local(arguments)  # they act here, not in the logger
    run = open_installed_run(arguments)
    _act_here(state.wandb, run, local)
    return run


def _act_here(wandb: Any, run: Any, local: dict[str, Any]) -> None:
    """What plain wandb.init does in the calling process for these keywords, done here, in
    the process that called it (``_init_keywords``)."""
    if local.pop("sync_tensorboard", False) and not wandb.patched["tensorboard"]:
        # wandb's own patch: each writer's log directory goes to wandb.run (the funnel's
        # Run) through _tensorboard_callback. Raises as plain wandb's init does when the
        # tensorboard package is missing.
        from wandb.integration import tensorboard

        tensorboard.patch()
    if local.pop("monitor_gym", False) and not wandb.patched["gym"]:
        from wandb.integration import gym  # its videos go through wandb.log: the funnel's

        gym.monitor()  # type: ignore[no-untyped-call]
    _init_keywords.unsupported_here(
        run,
        local,
        "acts on the process that owns wandb's run (the funnel's logger), not on this one",
    )


def open_installed_run(arguments: dict[str, Any]) -> Any:
    """Open (or join) the funnel's run with wandb.init ``arguments`` (funnel options among
    them win over install()'s), and make it the wandb module's run. In a launched job the
    first rank to call hosts the funnel: libraries pick which ranks call wandb.init."""
    state = _installed
    if state is None:
        raise RuntimeError("wandb_funnel: not installed")
    run = _api.open_run(None, {**state.options, **arguments}, first_caller_hosts=True)
    view = as_installed(run, state.wandb)
    _set_globals(state, view)
    return view


def _disabled(settings: Any) -> bool:
    mode = settings.get("mode") if isinstance(settings, dict) else getattr(settings, "mode", None)
    return mode == "disabled"


def _set_globals(state: _Installed, run: Any) -> None:
    wandb = state.wandb
    wandb.run = run
    wandb.config = run.config
    wandb.summary = run.summary
    for name in _RUN_GLOBALS:
        setattr(wandb, name, getattr(run, name))
    finish = type(run).finish

    # The installed run's finish (called directly, or through wandb.finish) puts the module
    # back to its pre-init state, as wandb's own finish does.
    def finish_and_unset(exit_code: int | None = None, quiet: bool | None = None) -> None:
        try:
            finish(run, exit_code)
        finally:
            _unset_globals(state, run)

    run.finish = finish_and_unset


def _unset_globals(state: _Installed, run: Any) -> None:
    wandb = state.wandb
    if wandb.run is not run:
        return
    for name in (*_STATE_GLOBALS, *_RUN_GLOBALS):
        setattr(wandb, name, state.originals[name])


def _finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """wandb.finish, through the funnel."""
    if _installed is not None and isinstance(_current.get(), Run):
        _api.finish(exit_code)
        return
    _real("finish")(exit_code)


def _login(*args: Any, **kwargs: Any) -> Any:
    """wandb.login: with no key to store and the run offline (the funnel's default, unless
    WANDB_MODE says otherwise) it does what wandb's login does in offline mode: asks for
    nothing, warns that it cannot verify, returns False. Given a key (or WANDB_API_KEY), or
    online, it is wandb's own (wandb stores the key, or prompts, as it always does)."""
    mode = os.environ.get("WANDB_MODE")
    key = kwargs.get("key") or (args[1] if len(args) > 1 else None)
    offline = mode in (None, "", "offline", "dryrun", "disabled")
    if offline and not key and not os.environ.get("WANDB_API_KEY"):
        wandb = _installed.wandb if _installed is not None else None
        if wandb is not None:
            wandb.termwarn("Unable to verify login in offline mode.")
        return False
    return _real("login")(*args, **kwargs)  # a key to store, or online: wandb's own


def _real(name: str) -> Any:
    import wandb

    function = getattr(wandb, name)
    return getattr(function, ORIGINAL_ATTRIBUTE, function)
