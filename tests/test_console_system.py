"""The console copy's bound and line rules, the logger's line assembly, and the system
sampler, as pure logic (end to end under torchrun: tests/processes/test_console.py)."""

from __future__ import annotations

import os
import sys
import time
import types
from typing import Any

import pytest

from wandb_funnel._logger.console import ConsoleLines
from wandb_funnel._worker import console, system


class Sink:
    def __init__(self) -> None:
        self.out: list[tuple[str, str]] = []

    def output(self, stream: str, text: str, timestamp: float) -> None:
        self.out.append((stream, text))


def test_one_rank_s_console_goes_through_as_written_in_the_order_written() -> None:
    """One rank (a one-process script): every write as it was, unlabelled, \r and half-lines
    included, stdout and stderr in the order the process wrote them (as wrap_raw records
    them for plain wandb); consecutive writes to one stream share a record."""
    lines, sink = ConsoleLines(), Sink()
    lines.take(
        0,
        {
            "lines": [
                [1, 1.0, "out 0"],
                [1, 1.1, "\n"],
                [2, 1.2, "\r 10%|#"],
                [1, 1.3, "{'loss': 1}\n"],
                [2, 1.4, "\r 20%|##"],
            ]
        },
        sink,
    )
    lines.take(0, {"lines": [[2, 1.5, "\n"], [1, 1.6, "done\n"]]}, sink)
    assert sink.out == [
        ("stdout", "out 0\n"),
        ("stderr", "\r 10%|#"),
        ("stdout", "{'loss': 1}\n"),
        ("stderr", "\r 20%|##"),
        ("stderr", "\n"),
        ("stdout", "done\n"),
    ]
    assert lines.lines == 4 and not lines.labelled
    lines.take(0, {"lines": [[1, 1.7, "no end"]]}, sink)
    lines.flush(sink)  # written already; counted as a line at close, left as plain wandb does
    assert sink.out[-1] == ("stdout", "no end") and lines.lines == 5


def test_a_second_rank_starts_the_labels_and_ends_the_first_rank_s_open_line() -> None:
    lines, sink = ConsoleLines(), Sink()
    lines.take(0, {"lines": [[1, 1.0, "before\nhalf"], [2, 1.1, "err done\n"]]}, sink)
    lines.label(sink)  # rank 1 attached
    lines.label(sink)  # once
    lines.take(0, {"lines": [[1, 1.2, " rest\n"]]}, sink)
    lines.take(1, {"lines": [[2, 1.3, "e1\n"], [1, 1.4, "o1\n"], [2, 1.5, "e2\n"]]}, sink)
    assert sink.out == [
        ("stdout", "before\nhalf"),
        ("stderr", "err done\n"),
        ("stdout", "\n"),  # the open line ended, so labelled lines start lines of their own
        ("stdout", "[rank 0]  rest\n"),
        ("stderr", "[rank 1] e1\n"),
        ("stdout", "[rank 1] o1\n"),
        ("stderr", "[rank 1] e2\n"),
    ]
    assert lines.lines == 7 and lines.dropped == 0


def test_the_logger_writes_whole_lines_labelled_and_keeps_half_lines_apart() -> None:
    lines, sink = ConsoleLines(), Sink()
    lines.label(sink)  # several ranks
    lines.take(1, {"lines": [[1, 1.0, "abc"]]}, sink)
    lines.take(2, {"lines": [[1, 1.1, "other rank\n"]]}, sink)
    lines.take(1, {"lines": [[1, 1.2, "def\n"], [2, 1.3, "err"], [1, 1.4, "\r10%\r20%"]]}, sink)
    assert sink.out == [("stdout", "[rank 2] other rank\n"), ("stdout", "[rank 1] abcdef\n")]
    # A progress bar's redraws: only the last stands, written when its line ends.
    lines.take(1, {"lines": [[1, 1.5, "\r30%\r"], [1, 1.6, "\rdone\r\n"]]}, sink)
    assert sink.out[2:] == [("stdout", "[rank 1] done\n")]
    lines.take(1, {"lines": [[2, 1.7, " more"]]}, sink)
    lines.flush(sink)  # at close: what ranks left unfinished
    assert sink.out[3:] == [("stderr", "[rank 1] err more\n")]
    assert lines.lines == 4 and lines.dropped == 0
    lines.take(3, {"lines": [[1, 2.0, "a\nb\n"]], "dropped": 5}, sink, late=True)
    assert lines.dropped == 7 and len(sink.out) == 4  # past the close's deadline: counted


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh console state with a budget of 3 lines and no refill."""
    monkeypatch.setattr(console, "CONSOLE_LINES_PER_S", 0)
    monkeypatch.setattr(console, "_tokens", 3.0)
    monkeypatch.setattr(console, "_pending", [])
    monkeypatch.setattr(console, "_pending_chars", 0)
    monkeypatch.setattr(console, "_dropped", 0)
    monkeypatch.setattr(console, "_mode", {1: "start", 2: "start"})
    return console


def test_redraws_cost_lines_and_a_kept_line_past_the_budget_is_cut(budget: Any) -> None:
    budget._capture(1, "bar")  # a line begun: 1 of 3
    budget._capture(1, "\r10%")  # a redraw: 2 of 3
    budget._capture(1, "\r20%")  # 3 of 3
    budget._capture(1, "\r30%\rmore\n")  # over: the kept part ends here, the rest is cut
    budget._capture(1, "next\n")  # a new line, over the budget: dropped, counted
    taken, dropped = budget._take()
    assert "".join(item[2] for item in taken) == "bar\r10%\r20%\n"
    assert dropped == 1


def test_a_line_is_kept_or_dropped_whole_and_every_dropped_line_counted(budget: Any) -> None:
    budget._capture(1, "one\ntwo\n")  # 2 lines: kept
    budget._capture(1, "three")  # a line begun: kept (the last of the budget) ...
    budget._capture(1, " and more\nfour")  # ... to its end; "four" begins past the budget
    budget._capture(1, " still four\nfive\n")  # the rest of four, and five: dropped
    taken, dropped = budget._take()
    assert "".join(item[2] for item in taken) == "one\ntwo\nthree and more\n"
    assert dropped == 2  # four and five, each counted once


def test_the_console_copy_never_changes_what_the_terminal_gets(capsys: Any) -> None:
    class Out:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> int:
            self.text += text
            return len(text)

    out = Out()
    console._patch(out, 1)
    console._patch(out, 1)  # once only
    assert out.write("hello\n") == 6 and out.text == "hello\n"
    assert getattr(out.write, "__wandb_funnel_console__", False)


def test_the_sampler_reads_this_process_tree() -> None:
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc here")  # Linux only, as documented
    sampler = system.Sampler(0.01)
    first = sampler.sample(time.monotonic())
    busy = time.monotonic() + 0.2
    while time.monotonic() < busy:
        sum(range(1000))
    second = sampler.sample(time.monotonic())
    assert "cpu" not in first and second["cpu"] > 10
    assert second["proc.memory.rssMB"] > 5 and second["proc.cpu.threads"] >= 1


def test_gpus_are_read_through_nvml_when_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50 + h, memory=20),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2 * 2**30, total=8 * 2**30),
        nvmlDeviceGetPowerUsage=lambda h: 150_000,
        nvmlDeviceGetTemperature=lambda h, kind: 61,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    read = system._nvml()
    assert read is not None
    values = read()
    assert values["gpu.1.gpu"] == 51 and values["gpu.0.memoryAllocated"] == 25.0
    assert values["gpu.0.powerWatts"] == 150.0 and values["gpu.1.temp"] == 61
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: nothing, no error
    assert system._nvml() is None
