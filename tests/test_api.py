"""_api: wf.init's choices that need no logger (RANK handling, argument checks, the config of
an attaching rank). Whole jobs are in tests/processes."""

from __future__ import annotations

import argparse
import os
from typing import Any

import pytest

from wandb_funnel import _api
from wandb_funnel._constants import ENV_RANK_PID
from wandb_funnel.errors import FunnelWarning


def test_rank_from_the_launcher_is_taken_once_by_the_process_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv(ENV_RANK_PID, raising=False)
    assert _api._env_rank() == 3
    assert os.environ[ENV_RANK_PID] == str(os.getpid())  # children will know it is not theirs
    monkeypatch.setenv(ENV_RANK_PID, "1")  # inherited from another process: not ours
    assert _api._env_rank() is None
    monkeypatch.delenv("RANK")
    assert _api._env_rank() is None


def test_a_bad_rank_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.delenv(ENV_RANK_PID, raising=False)
    with pytest.raises(ValueError, match="RANK must be an integer"):
        _api._env_rank()
    with pytest.raises(ValueError, match="rank must be a non-negative int"):
        _api.init(rank=-1)
    with pytest.raises(ValueError, match="rank must be a non-negative int"):
        _api.init(rank=True)
    with pytest.raises(TypeError, match="not options="):
        _api.init(options=None)
    with pytest.raises(TypeError, match="not topology="):
        _api.init(topology=None)


def test_an_attaching_rank_warns_about_the_owners_arguments() -> None:
    with pytest.warns(FunnelWarning, match="ignored: name, project"):
        _api._warn_ignored({"project": "p", "name": "n", "reduce": "sum"}, _api._ATTACHED)


def test_init_config_is_taken_as_wandb_takes_it() -> None:
    kwargs: dict[str, Any] = {"config": argparse.Namespace(batch=8, lr=0.1), "project": "p"}
    assert _api._init_config(kwargs) == {"batch": 8, "lr": 0.1}
    assert kwargs == {"project": "p"}  # config is taken out
    kwargs = {"config": {"a": 1, "b": 2}, "config_exclude_keys": ["b"], "allow_val_change": True}
    assert _api._init_config(kwargs) == {"a": 1}
    assert kwargs == {}
    assert _api._init_config({"config": {"a": 1, "b": 2}, "config_include_keys": ["b"]}) == {"b": 2}
    with pytest.raises(ValueError, match="mutually exclusive"):
        _api._init_config({"config_include_keys": [], "config_exclude_keys": []})
    with pytest.raises(TypeError, match="config must be a dict"):
        _api._init_config({"config": 3})


def test_finish_without_a_run_does_nothing() -> None:
    assert _api.current_run() is None
    _api.finish()  # no run here: no error, no funnel started
    assert _api.current_run() is None
