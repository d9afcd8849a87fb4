"""FunnelOptions, Topology and the logger's start message: every option validated once, at the
call site, and again (as input) when the logger reads its start message."""

from __future__ import annotations

import json
from typing import Any

import pytest

import wandb_funnel as wf
from wandb_funnel._constants import DEFAULT_CLOSE_TIMEOUT, DEFAULT_STEP_KEY
from wandb_funnel._options import FunnelOptions, PerRankRuns, Topology
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


def test_options_from_environment_variables() -> None:
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
    options = FunnelOptions.from_env(env)
    assert options == {
        "run_mode": "new",
        "reduce": {"loss": "max", "acc": "min"},
        "close_timeout": 12.5,
        "max_pending_rows": 7,
    }
    FunnelOptions(**options)  # valid
    assert FunnelOptions.from_env({"WANDB_FUNNEL_REDUCE": "sum"}) == {"reduce": "sum"}
    with pytest.raises(ValueError, match="close_timeout must be a number, got 'soon'"):
        FunnelOptions.from_env({"WANDB_FUNNEL_CLOSE_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="KEY=REDUCER"):
        FunnelOptions.from_env({"WANDB_FUNNEL_REDUCE": "loss=max,=min"})
