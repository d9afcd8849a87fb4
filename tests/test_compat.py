"""``sinks/wandb/compat.py``: every capability that differs between the wandb releases the
funnel supports (0.22 and later), checked by feature on stand-ins shaped as each release's
(the names and signatures come from wandb's own source, release by release:
docs/guide/compatibility.md). End to end, on whichever wandb is installed:
tests/processes/test_wandb_versions.py; across releases: ``tox -e wandb-oldest`` /
``wandb-newest``."""

from __future__ import annotations

import glob
import pathlib
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from wandb_funnel.sinks.wandb import compat


class Lacks(dict[str, str]):
    """What a sink is told this wandb lacks (``WandbSink._degrade`` records the same)."""

    def __call__(self, capability: str, consequence: str) -> None:
        self[capability] = consequence


class _Settings:
    """``wandb.Settings`` as a release without the funnel's flush setting has it."""

    model_fields: ClassVar[dict[str, Any]] = {"console": None, "x_stats_pid": None, "mode": None}


def test_a_setting_this_wandb_lacks_is_left_out_and_degraded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import wandb

    monkeypatch.setattr(wandb, "Settings", _Settings)
    settings: dict[str, Any] = {"console": "off"}
    wanted = {"x_transaction_log_flush_interval": 0.2, "x_stats_pid": 42}
    lacks = Lacks()
    compat.add_funnel_settings(settings, wanted, lacks)
    assert settings == {"console": "off", "x_stats_pid": 42}
    assert list(lacks) == ["setting x_transaction_log_flush_interval"]
    assert "32 KiB" in lacks["setting x_transaction_log_flush_interval"]  # the cost, in words


def test_the_users_own_value_wins_and_is_never_degraded(monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    monkeypatch.setattr(wandb, "Settings", _Settings)
    settings = {"x_transaction_log_flush_interval": 5.0}  # the user's: wandb judges it
    lacks = Lacks()
    compat.add_funnel_settings(settings, {"x_transaction_log_flush_interval": 0.2}, lacks)
    assert settings == {"x_transaction_log_flush_interval": 5.0}
    assert lacks == {}


def test_the_installed_wandb_takes_what_it_has() -> None:
    import wandb

    settings: dict[str, Any] = {}
    lacks = Lacks()
    compat.add_funnel_settings(settings, {"x_stats_pid": 7}, lacks)
    assert settings == {"x_stats_pid": 7}  # every release from 0.22 has it
    flush = "x_transaction_log_flush_interval" in wandb.Settings.model_fields
    compat.add_funnel_settings(settings, {"x_transaction_log_flush_interval": 0.2}, lacks)
    assert ("x_transaction_log_flush_interval" in settings) is flush
    assert len(lacks) == (0 if flush else 1)


def test_the_wandb_sink_says_each_lack_once_and_the_ledger_counts_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from wandb_funnel.sinks import Degradable
    from wandb_funnel.sinks.wandb.run import WandbSink

    said: list[str] = []
    sink = WandbSink.__new__(WandbSink)  # its _degrade alone: no run is opened
    sink.degraded, sink._say = {}, said.append
    sink._wandb = SimpleNamespace(__version__="0.x")  # type: ignore[assignment]
    for _ in range(3):
        sink._degrade("setting x_y", "rows reach disk later")
    assert said == ["this wandb (0.x) has no setting x_y: rows reach disk later"]
    assert isinstance(sink, Degradable)
    assert sink.degraded == {"setting x_y": "rows reach disk later"}


class _Published:
    def __init__(self, with_nowait: bool) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._publish_output_raw: Any = self._with_nowait if with_nowait else self._without

    def _with_nowait(self, record: Any, nowait: bool = False) -> None:  # 0.22.3 and later
        self.calls.append((record, nowait))

    def _without(self, outdata: Any) -> None:  # 0.22.0 to 0.22.2
        self.calls.append((outdata,))

    def publish_stats(self, stats_dict: dict[str, Any]) -> None:
        self.calls.append(("stats", stats_dict))


@pytest.mark.parametrize("nowait", [True, False])
@pytest.mark.parametrize("where", ["_interface", "_backend"])
def test_console_records_reach_the_interface_of_every_release(where: str, nowait: bool) -> None:
    iface = _Published(nowait)
    # 0.26.1 and later: Run._interface; before: Run._backend.interface
    run = (
        SimpleNamespace(_interface=iface)
        if where == "_interface"
        else SimpleNamespace(_backend=SimpleNamespace(interface=iface))
    )
    lacks = Lacks()
    assert compat.publish_output_raw(run, "line", lacks)
    assert iface.calls == [("line", False) if nowait else ("line",)]
    assert compat.publish_stats(run, {"cpu": 1.0}, lacks)
    assert iface.calls[-1] == ("stats", {"cpu": 1.0})
    assert lacks == {}


def test_a_run_without_an_interface_degrades_both() -> None:
    run, lacks = SimpleNamespace(), Lacks()
    assert not compat.publish_output_raw(run, "line", lacks)
    assert not compat.publish_stats(run, {}, lacks)
    assert sorted(lacks) == [
        "interface to publish console records",
        "interface to publish stats records",
    ]


class _OldRun:
    """``Run.save`` before wandb 0.28.1: no ``glob``; it always expands the pattern."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, str, str]] = []

    def save(self, glob_str: str, base_path: str | None = None, policy: str = "live") -> None:
        self.saved.append((glob_str, str(base_path), policy))


class _NewRun(_OldRun):
    def save(
        self, glob_str: str, base_path: str | None = None, policy: str = "live", glob: bool = True
    ) -> None:
        self.saved.append((glob_str, str(base_path), f"{policy} glob={glob}"))


def test_a_literal_save_on_a_wandb_without_glob_matches_only_its_own_file(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "weird[1].txt").write_text("a")
    (tmp_path / "weird1.txt").write_text("b")  # what the unescaped pattern would match
    old, new = _OldRun(), _NewRun()
    path = str(tmp_path / "weird[1].txt")
    compat.save(old, path, str(tmp_path), "now", expand=False)
    compat.save(new, path, str(tmp_path), "now", expand=False)
    compat.save(old, str(tmp_path / "*.txt"), str(tmp_path), "end", expand=True)
    assert new.saved == [(path, str(tmp_path), "now glob=False")]
    escaped = old.saved[0][0]
    assert glob.glob(escaped) == [path]  # old wandb expands it: only the literal file
    assert old.saved[1] == (str(tmp_path / "*.txt"), str(tmp_path), "end")


def test_define_metric_goal_is_refused_where_plain_wandb_refuses_it() -> None:
    """wandb 0.29 dropped ``goal``: its ``define_metric(..., goal=...)`` is a TypeError at
    the call. The rank's check agrees with whether wandb's own signature binds it."""
    import inspect

    from wandb.sdk.wandb_run import Run

    from wandb_funnel._worker.run_updates import _wandb_takes_goal

    try:
        inspect.signature(Run.define_metric).bind(object(), "loss", goal="minimize")
        plain_takes_it = True
    except TypeError:
        plain_takes_it = False
    assert _wandb_takes_goal() is plain_takes_it
    assert compat.run_method_takes("log", "step")
