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
    # Recorded as absent (a delenv of an absent variable records nothing): what _env_rank
    # sets here must not outlive the test (it leaked into the next job's processes, whose
    # mp.spawn ranks then took themselves for inherited children: two runs, not one).
    monkeypatch.setenv(ENV_RANK_PID, "")
    monkeypatch.delenv(ENV_RANK_PID)
    assert _api._env_rank() == 3
    assert os.environ[ENV_RANK_PID] == str(os.getpid())  # children will know it is not theirs
    monkeypatch.setenv(ENV_RANK_PID, "1")  # inherited from another process: not ours
    assert _api._env_rank() is None
    monkeypatch.delenv("RANK")
    assert _api._env_rank() is None


def test_a_bad_rank_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv(ENV_RANK_PID, "")  # recorded as absent, as above
    monkeypatch.delenv(ENV_RANK_PID)
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


def test_arguments_that_name_the_funnels_own_run_are_taken_without_a_word(
    tmp_path: Any, recwarn: pytest.WarningsRecorder
) -> None:
    """Lightning's ``WandbLogger`` in a ``ddp_spawn`` rank calls ``wandb.init(id=run.id,
    resume="allow", project=..., name=..., dir=...)``: the funnel's run, so nothing is said
    (issue 34: a FunnelWarning twice); an argument that differs is named."""
    from wandb_funnel._worker.run import AttachInfo, Run

    run_dir = str(tmp_path / "wandb" / "offline-run-x" / "files")
    info = AttachInfo(
        "ipc:///nowhere",
        "t",
        "abc",
        1 << 20,
        run_info={"name": "n", "project": "p", "dir": run_dir},
    )
    run = Run(info, requested_rank=None)
    same = {"id": "abc", "resume": "allow", "project": "p", "name": "n", "dir": str(tmp_path)}
    _api._warn_ignored(same, _api._ATTACHED, run)
    assert not [w for w in recwarn if issubclass(w.category, FunnelWarning)]
    with pytest.warns(FunnelWarning, match="ignored: name$"):
        _api._warn_ignored({**same, "name": "other"}, _api._ATTACHED, run)


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
