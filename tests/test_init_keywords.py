"""wandb.init's keywords that act in the calling process are taken out of what goes to the
logger's wandb.init (where they would patch the logger, silently doing nothing for the
caller), from every place wandb reads them."""

from __future__ import annotations

from typing import Any

import pytest
import wandb

from wandb_funnel._init_keywords import take_local, unsupported_here


@pytest.mark.parametrize(
    ("kwargs", "env", "expected"),
    [
        ({"sync_tensorboard": True}, None, True),
        ({"tensorboard": True}, None, True),  # wandb's deprecated name
        ({"tensorboard": True, "sync_tensorboard": False}, None, False),  # the new name wins
        ({"settings": {"sync_tensorboard": True}}, None, True),
        ({"settings": wandb.Settings(sync_tensorboard=True)}, None, True),
        ({}, "true", True),  # WANDB_SYNC_TENSORBOARD, as wandb's settings read it
        ({"sync_tensorboard": False}, "true", False),  # a keyword over the environment
        ({}, None, False),
    ],
)
def test_sync_tensorboard_is_taken_from_wherever_wandb_reads_it(
    kwargs: dict[str, Any], env: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("WANDB_SYNC_TENSORBOARD", raising=False)
    else:
        monkeypatch.setenv("WANDB_SYNC_TENSORBOARD", env)
    kwargs = {"project": "p", **kwargs}
    local = take_local(kwargs)
    assert local.get("sync_tensorboard", False) is expected
    # Nothing of it goes on to the logger's wandb.init; the rest does.
    assert kwargs.pop("project") == "p"
    assert set(kwargs) <= {"settings"}
    assert "sync_tensorboard" not in kwargs.get("settings", {})


def _settings_with_capture_loggers() -> Any:
    """A ``wandb.Settings`` where the installed wandb has ``capture_loggers``; before it
    (wandb 0.22), the same settings as the dict a user can still pass."""
    if "capture_loggers" in wandb.Settings.model_fields:
        return wandb.Settings(capture_loggers={"mylog": "INFO"}, console="off")
    return {"capture_loggers": {"mylog": "INFO"}, "console": "off"}


def test_monitor_gym_and_capture_loggers_are_taken_too() -> None:
    kwargs: dict[str, Any] = {"monitor_gym": True, "settings": _settings_with_capture_loggers()}
    local = take_local(kwargs)
    assert local == {"monitor_gym": True, "capture_loggers": {"mylog": "INFO"}}
    assert kwargs == {"settings": {"console": "off"}}  # the rest of the settings stays


class CountingRun:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def _unsupported(self, name: str, why: str) -> None:
        self.calls.append((name, why))


def test_each_keyword_that_cannot_act_is_counted() -> None:
    run = CountingRun()
    unsupported_here(run, {"sync_tensorboard": True, "monitor_gym": True}, "why")
    assert [name for name, _ in run.calls] == ["init-sync_tensorboard", "init-monitor_gym"]
    assert all("why" in why for _, why in run.calls)


@pytest.mark.parametrize("logger_host", [None, "this-host", "another-host"])
def test_a_tensorboard_directory_is_sent_from_the_loggers_host_and_counted_from_another(
    logger_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wandb's tensorboard patch calls ``wandb.run._tensorboard_callback``: on the logger's
    host the directory goes to the logger (with this process's working directory); from
    another host its files are not on the logger's disk: warned once and counted."""
    import os
    import socket

    from wandb_funnel._protocol.messages import SUMMARY, TENSORBOARD
    from wandb_funnel._worker.run import AttachInfo, Run
    from wandb_funnel.errors import FunnelWarning

    monkeypatch.setattr(socket, "gethostname", lambda: "this-host")
    run = Run(AttachInfo("ipc:///nowhere", "t", "r", 1 << 20, None, logger_host), None)
    sent: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr(run, "_send_update", lambda kind, data: sent.append((kind, data)))
    if logger_host == "another-host":
        with pytest.warns(FunnelWarning, match="another host"):
            run._tensorboard_callback("runs/a", save=True, root_logdir="")
        run._tensorboard_callback("runs/b")  # counted again, warned once
        assert sent == [
            (SUMMARY, {"_funnel/unsupported_calls": 1}),
            (SUMMARY, {"_funnel/unsupported_calls": 2}),
        ]
    else:
        run._tensorboard_callback("runs/a", save=False, root_logdir="runs")
        assert sent == [
            (
                TENSORBOARD,
                {"log_dir": "runs/a", "save": False, "root_dir": "runs", "cwd": os.getcwd()},
            )
        ]
