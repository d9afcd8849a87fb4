"""FunnelOptions, Topology and the logger's start message: every option validated once, at the
call site, and again (as input) when the logger reads its start message."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

import wandb_funnel as wf
from wandb_funnel._constants import DEFAULT_CLOSE_TIMEOUT, DEFAULT_STEP_KEY
from wandb_funnel._launcher_env import DistEnv
from wandb_funnel._options import FunnelOptions, PerRankRuns, Topology, resolve, variable
from wandb_funnel._protocol.messages import LoggerStart


def test_defaults_and_split_leave_wandb_arguments_alone() -> None:
    options, rest = FunnelOptions.split(
        {"project": "p", "config": {"lr": 1}, "reduce": "sum", "close_timeout": 5}
    )
    assert rest == {"project": "p", "config": {"lr": 1}}
    assert options.reduce == {"*": "sum"}
    assert options.close_timeout == 5.0 and isinstance(options.close_timeout, float)
    assert options.step_key == DEFAULT_STEP_KEY
    assert FunnelOptions().close_timeout == DEFAULT_CLOSE_TIMEOUT


@pytest.mark.parametrize(
    ("kwargs", "exc", "named"),
    [
        ({"run_mode": "everything"}, ValueError, "run_mode"),
        ({"run_mode": None}, ValueError, "run_mode"),
        ({"rank_scope": "node"}, ValueError, "rank_scope"),
        ({"on_network_error": "retry"}, ValueError, "on_network_error"),
        ({"on_network_error": None}, ValueError, "on_network_error"),
        ({"reduce": {"loss": "median"}}, ValueError, "median"),
        ({"reduce": {1: "sum"}}, TypeError, "reduce keys"),
        ({"reduce": 3}, TypeError, "reduce"),
        ({"reduce": "avg"}, ValueError, "avg"),
        ({"step_key": ""}, ValueError, "step_key"),
        ({"step_key": 3}, ValueError, "step_key"),
        ({"close_timeout": 0}, ValueError, "close_timeout"),
        ({"close_timeout": "5"}, ValueError, "close_timeout"),
        ({"close_timeout": True}, ValueError, "close_timeout"),
        ({"start_timeout": -1}, ValueError, "start_timeout"),
        ({"start_timeout": float("nan")}, ValueError, "start_timeout"),
        ({"reorder_window": -0.5}, ValueError, "reorder_window"),
        ({"max_pending_rows": 0}, ValueError, "max_pending_rows"),
        ({"max_pending_rows": 2.0}, ValueError, "max_pending_rows"),
        ({"max_record_bytes": True}, ValueError, "max_record_bytes"),
    ],
)
def test_a_bad_option_is_named_at_the_call_site(
    kwargs: dict[str, Any], exc: type[Exception], named: str
) -> None:
    with pytest.raises(exc, match=named):
        FunnelOptions(**kwargs)
    with pytest.raises(exc, match=named):  # the same check, through the public entry point
        wf.Funnel(project="p", **kwargs)


def test_options_are_checked_in_their_documented_order() -> None:
    with pytest.raises(ValueError, match="run_mode"):  # the first bad one is named
        FunnelOptions(step_key="", run_mode="bad")


def test_zero_reorder_window_is_allowed() -> None:
    assert FunnelOptions(reorder_window=0).reorder_window == 0.0


def test_options_given_twice_are_refused() -> None:
    with pytest.raises(TypeError, match="close_timeout"):
        wf.Funnel(FunnelOptions(), close_timeout=3)
    with pytest.raises(TypeError, match="FunnelOptions"):
        wf.Funnel({"close_timeout": 3})  # type: ignore[arg-type]


def test_options_round_trip_the_wire_and_malformed_ones_are_refused() -> None:
    options = FunnelOptions(reduce={"a*": "max"}, close_timeout=7, rank_scope="worker")
    assert FunnelOptions.from_wire(json.loads(json.dumps(options.to_wire()))) == options
    assert options != FunnelOptions()
    with pytest.raises(ValueError, match="malformed"):
        FunnelOptions.from_wire({"run_mode": "auto"})
    bad = {**options.to_wire(), "close_timeout": -1}
    with pytest.raises(ValueError, match="close_timeout"):
        FunnelOptions.from_wire(bad)


def test_topology_round_trips_and_names_per_rank_runs() -> None:
    per = PerRankRuns("base-worker-1-rank-{local_rank}", "base-worker-1", 4)
    topology = Topology(3, 8, (4, 5, 6, 7), "10.0.0.2", per)
    assert Topology.from_wire(json.loads(json.dumps(topology.to_wire()))) == topology
    assert per.id_template.format(**per.names(6)) == "base-worker-1-rank-2"
    assert Topology.from_wire(Topology().to_wire()) == Topology()
    with pytest.raises(ValueError, match="malformed topology"):
        Topology.from_wire({"owner_rank": 0})


def test_the_logger_start_message_is_typed_and_checked() -> None:
    start = LoggerStart(
        address="ipc:///tmp/x/s",
        ipc_dir="/tmp/x",
        token="t",
        owner_pid=12,
        ready_fd=5,
        options=FunnelOptions(step_key="step"),
        topology=Topology(owner_rank=1),
        init_kwargs={"id": "abc", "project": "p"},
    )
    back = LoggerStart.from_json(start.to_json())
    assert back == start and back.run_id == "abc"
    assert isinstance(back.options, FunnelOptions) and isinstance(back.topology, Topology)
    data = json.loads(start.to_json())
    del data["init_kwargs"]["id"]
    with pytest.raises(ValueError, match="malformed logger start"):
        LoggerStart.from_json(json.dumps(data).encode())
    with pytest.raises(ValueError, match="malformed logger start"):
        LoggerStart.from_json(b"not json")


def test_resolve_takes_the_keyword_then_the_variable_then_the_default() -> None:
    env = {
        "WANDB_FUNNEL_RUN_MODE": "new",
        "WANDB_FUNNEL_REDUCE": "loss=max, acc=min",
        "WANDB_FUNNEL_CLOSE_TIMEOUT": "12.5",
        "WANDB_FUNNEL_MAX_PENDING_ROWS": "7",
        "WANDB_FUNNEL_STEP_KEY": "",  # empty: not set
        "_WANDB_FUNNEL_ADDRESS": "ipc:///x",  # a funnel's address, not an option
        # A running funnel's exported limit is its state, never a child's option (issue 24:
        # both were WANDB_FUNNEL_MAX_RECORD_BYTES, so install() under a funnel took it).
        "_WANDB_FUNNEL_MAX_RECORD_BYTES": "1",
    }
    options = resolve({}, env)
    assert options == {
        "run_mode": "new",
        "reduce": {"loss": "max", "acc": "min"},
        "close_timeout": 12.5,
        "max_pending_rows": 7,
    }
    assert FunnelOptions(**options).step_key == DEFAULT_STEP_KEY  # the default
    # A keyword (or flag) wins over its variable; the others still come from theirs.
    mixed = resolve({"run_mode": "shared", "reduce": None}, env)
    assert mixed["run_mode"] == "shared" and mixed["reduce"] is None
    assert mixed["close_timeout"] == 12.5
    assert resolve({}, {"WANDB_FUNNEL_REDUCE": "sum"}) == {"reduce": "sum"}
    # Every option has its variable, read by name.
    every = {variable(n): "1" for n in FunnelOptions.NAMES if n not in ("reduce", "step_key")}
    every.update(WANDB_FUNNEL_RUN_MODE="auto", WANDB_FUNNEL_RANK_SCOPE="global")
    every.update(WANDB_FUNNEL_ON_NETWORK_ERROR="raise", WANDB_FUNNEL_STEP_KEY="s")
    every.update(WANDB_FUNNEL_RESTARTS="new", WANDB_FUNNEL_TIER="flat")
    assert set(resolve({}, every)) == FunnelOptions.NAMES - {"reduce"}


def test_resolve_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_FUNNEL_STALL_TIMEOUT", "10")
    assert resolve({}) == {"stall_timeout": 10.0}
    assert FunnelOptions.split({"project": "p"}) == (
        FunnelOptions(stall_timeout=10),
        {"project": "p"},
    )


@pytest.mark.parametrize(
    ("name", "raw", "why"),
    [
        ("CLOSE_TIMEOUT", "soon", "close_timeout must be a number, got 'soon'"),
        ("STALL_TIMEOUT", "-1", "stall_timeout must be >= 0, got -1.0"),
        ("MAX_PENDING_ROWS", "2.5", "max_pending_rows must be an int"),
        ("MAX_LOGGER_RESTARTS", "-1", "max_logger_restarts must be an int >= 0"),
        ("RUN_MODE", "all", "run_mode must be one of"),
        ("REDUCE", "loss=median", "unknown reducer 'median'"),
        ("REDUCE", "loss=max,=min", "KEY=REDUCER"),
    ],
)
def test_a_bad_variable_is_named_with_its_value(name: str, raw: str, why: str) -> None:
    env = {f"WANDB_FUNNEL_{name}": raw}
    with pytest.raises(ValueError, match=re.escape(f"WANDB_FUNNEL_{name}={raw!r}: ")) as caught:
        resolve({}, env)
    assert str(caught.value).startswith("wandb_funnel: WANDB_FUNNEL_")
    assert why in str(caught.value)
    # A keyword for that option wins: its variable is never read.
    keyword = {name.lower(): getattr(FunnelOptions(), name.lower())}
    assert resolve(keyword, env) == keyword


def test_funnel_and_init_take_the_variables_and_name_a_bad_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``wf.Funnel(**kwargs)`` (and ``wf.init``, whose private funnel it is): keyword, then
    variable, then default; a ``FunnelOptions`` given whole is complete (no variable read)."""
    monkeypatch.setenv("WANDB_FUNNEL_STALL_TIMEOUT", "10")
    monkeypatch.setenv("WANDB_FUNNEL_REDUCE", "sum")
    assert wf.Funnel(project="p").options == FunnelOptions(stall_timeout=10, reduce="sum")
    assert wf.Funnel(stall_timeout=5).options.stall_timeout == 5
    assert wf.Funnel(FunnelOptions()).options == FunnelOptions()
    monkeypatch.setenv("WANDB_FUNNEL_STALL_TIMEOUT", "ten")
    for entry in (wf.Funnel, wf.init):
        with pytest.raises(ValueError, match="WANDB_FUNNEL_STALL_TIMEOUT='ten'"):
            entry(project="p")
    assert wf.Funnel(stall_timeout=1).options.stall_timeout == 1


def test_a_rank_that_attaches_reads_no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that joins a funnel takes the owner's options (what acts in a rank comes
    in its ``AttachInfo``): its own variables are not read, a bad one included."""
    from wandb_funnel import _api
    from wandb_funnel._worker.run import AttachInfo, Run

    class Attached(Run):
        def _attach(self, timeout: float) -> bool:
            return True

    info = AttachInfo("ipc:///nowhere", "t", "abc", 1 << 20)
    monkeypatch.setattr(_api, "attach_info_from_env", lambda: info)
    monkeypatch.setattr(_api, "Run", Attached)
    monkeypatch.setenv("WANDB_FUNNEL_STALL_TIMEOUT", "ten")
    run = _api._new_run(None, {}, False)
    assert isinstance(run, Attached) and run._info == info


def test_a_launched_wf_init_takes_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """``wf.init`` in a launched job hands ``init_launched`` the options resolved over the
    variables (in the hosting rank they go to its Funnel; the issue's measured case is
    tests/processes/test_option_variables.py's)."""
    from wandb_funnel import _api

    seen: list[FunnelOptions] = []

    def fake(env: Any, options: FunnelOptions, kwargs: dict[str, Any], first: bool) -> Any:
        seen.append(options)
        raise RuntimeError("enough")

    monkeypatch.setattr(_api, "init_launched", fake)
    monkeypatch.setattr(
        _api, "detect_dist_env", lambda: DistEnv("torchrun", 0, 2, 0, 2, 0, "127.0.0.1", 1)
    )
    monkeypatch.setattr(_api, "attach_info_from_env", lambda: None)
    monkeypatch.setenv("WANDB_FUNNEL_STALL_TIMEOUT", "10")
    with pytest.raises(RuntimeError, match="enough"):
        wf.init(project="p", reduce="max")
    assert seen == [FunnelOptions(stall_timeout=10, reduce="max")]
    monkeypatch.setenv("WANDB_FUNNEL_RANK_SCOPE", "node")
    with pytest.raises(ValueError, match="WANDB_FUNNEL_RANK_SCOPE='node'"):
        wf.init(project="p")


def test_install_takes_its_keywords_then_the_export_then_the_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``install()``, and an installed child (``install_into``): what a parent's
    ``install()`` or ``wandb-funnel run`` exported wins over the variables (its flags won
    already), and the export round-trips."""
    from wandb_funnel._constants import ENV_INSTALL
    from wandb_funnel._wandb_module import install as installer

    for name in list(os.environ):
        if name.startswith("WANDB_FUNNEL_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv(ENV_INSTALL, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("WANDB_FUNNEL_RUN_MODE", "shared")
    monkeypatch.setenv("WANDB_FUNNEL_REDUCE", "max")
    try:
        wf.install(reduce="sum")
        assert installer._installed is not None
        assert installer._installed.options == {"run_mode": "shared", "reduce": "sum"}
        exported = os.environ[ENV_INSTALL]
        assert json.loads(exported) == {"reduce": "sum", "run_mode": "shared"}
    finally:
        wf.uninstall()
    # A child started under it: the export, then the variables of the child's environment.
    child = {
        ENV_INSTALL: exported,
        "WANDB_FUNNEL_RUN_MODE": "new",
        "WANDB_FUNNEL_STALL_TIMEOUT": "9",
    }
    assert installer.options_from_env(child) == {
        "reduce": "sum",
        "run_mode": "shared",
        "stall_timeout": 9.0,
    }
    monkeypatch.setenv("WANDB_FUNNEL_CLOSE_TIMEOUT", "0")
    with pytest.raises(ValueError, match="WANDB_FUNNEL_CLOSE_TIMEOUT='0'"):
        wf.install()
    assert installer._installed is None
    wf.install(close_timeout=3)  # the keyword wins: the variable is not read
    wf.uninstall()


def test_an_installed_child_says_which_variable_is_bad(tmp_path: Any) -> None:
    """A process started from an installed one installs at ``import wandb``
    (``_bootstrap/sitecustomize.py``): a bad variable there is said, named, and wandb is
    left as it is."""
    from wandb_funnel._constants import ENV_INSTALL

    bootstrap = os.path.join(os.path.dirname(wf.__file__), "_bootstrap")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_FUNNEL_")}
    env.update(PYTHONPATH=bootstrap, WANDB_FUNNEL_PREWARM="0")
    env.update({ENV_INSTALL: "{}", "WANDB_FUNNEL_MAX_RECORD_BYTES": "lots"})
    out = subprocess.run(
        [sys.executable, "-c", "import wandb"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "WANDB_FUNNEL_MAX_RECORD_BYTES='lots': max_record_bytes must be an int" in out.stderr
