"""Funnel's constructor and state before start: every argument checked at the call site,
before any process starts. Starting and closing are in tests/processes."""

from __future__ import annotations

import argparse

import pytest

import wandb_funnel as wf
from wandb_funnel._options import FunnelOptions, Topology


def test_options_and_wandb_arguments_are_told_apart() -> None:
    funnel = wf.Funnel(project="p", reduce="max", config={"lr": 1}, id="abc")
    assert funnel.options == FunnelOptions(reduce="max")
    assert funnel.topology == Topology()
    assert funnel.run_id == "abc"
    assert funnel._init_kwargs == {"project": "p", "config": {"lr": 1}, "id": "abc"}


def test_an_id_is_made_when_none_is_given() -> None:
    first, second = wf.Funnel(), wf.Funnel()
    assert len(first.run_id) == 8 and first.run_id.isalnum() and first.run_id != second.run_id


def test_wandb_run_id_names_the_run_when_no_id_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb's rule: ``WANDB_RUN_ID`` is the run's id unless ``id=`` says otherwise."""
    monkeypatch.setenv("WANDB_RUN_ID", "fromenv1")
    assert wf.Funnel().run_id == "fromenv1"
    assert wf.Funnel(id="given").run_id == "given"


def test_wandb_arguments_must_be_plain_data_and_are_named() -> None:
    with pytest.raises(TypeError, match="notes= must be plain data"):
        wf.Funnel(notes=object())
    # A config is stored as wandb stores it: JSON (int keys become str, objects their str).
    stored = wf.Funnel(config={"id2label": {0: "neg", 1: "pos"}, "f": print, "t": (1, 2)})
    assert stored._init_kwargs["config"] == {
        "id2label": {"0": "neg", "1": "pos"},
        "f": str(print),
        "t": [1, 2],
    }
    with pytest.raises(TypeError, match="id must be a str"):
        wf.Funnel(id=3)
    with pytest.raises(TypeError, match="topology must be a Topology"):
        wf.Funnel(topology={"owner_rank": 0})  # type: ignore[arg-type]
    namespace = wf.Funnel(config=argparse.Namespace(lr=0.5))
    assert namespace._init_kwargs["config"] == {"lr": 0.5}


def test_before_start_nothing_runs_and_close_is_a_no_op() -> None:
    funnel = wf.Funnel()
    assert funnel.logger_pid is None and funnel.tcp_address is None
    with pytest.raises(RuntimeError, match="not started"):
        _ = funnel.address
    with pytest.raises(RuntimeError, match="not started"):
        _ = funnel.run
    funnel.close()  # never started: nothing to close, no error
    assert funnel.exit_code is None
    assert "run_id=" in repr(funnel)
