"""System metrics of the training, from every rank: its process tree's CPU and memory, and on
each node the GPUs (NVML), for the run's System tab.

wandb-core samples only the process that called ``wandb.init`` (here, the logger). So each
process that logs samples itself, every ``x_stats_sampling_interval`` seconds on its flusher
thread, and sends the sample to the logger, which writes it as a ``stats`` record with wandb's
per-writer label (``/l:<label>``, what ``x_label`` gives each key), the label naming the rank
and the host: ``rank1-node7``. Keys follow wandb-core's: ``cpu`` (this rank's process tree,
percent of one core), ``proc.memory.rssMB``, ``proc.memory.percent``, ``proc.cpu.threads``,
and per GPU ``gpu.{i}.gpu``, ``gpu.{i}.memory``, ``gpu.{i}.memoryAllocated``,
``gpu.{i}.memoryAllocatedBytes``, ``gpu.{i}.powerWatts``, ``gpu.{i}.temp``.

Linux ``/proc`` only (no dependency); elsewhere the process metrics are left out. The GPUs are
read by one process per node (``LOCAL_RANK`` 0, or a process with no launcher), through
``pynvml`` (``nvidia-ml-py``) when it is installed and a driver answers; without either,
nothing GPU is sent and nothing breaks.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import STATS

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_HOST = socket.gethostname().split(".")[0]


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(ppid, cpu seconds, threads) of ``pid`` from /proc, or None. The cpu seconds include
    its waited-for children's, so a DataLoader worker that exits keeps its share."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # after "pid (comm) ": state is fields[0]
    try:
        cpu = sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICKS
        return int(fields[1]), cpu, int(fields[17])
    except (IndexError, ValueError):
        return None


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (DataLoader workers, ...)."""
    parents: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return [root]
    for name in names:
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                parents.setdefault(stat[0], []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, ()))
    return out


def _memory_total() -> int:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Sampler:
    """This process's samples; ``tick`` is called by the flusher thread."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = time.monotonic() + interval
        self._last: tuple[float, float] | None = None  # (monotonic, cpu seconds of the tree)
        self._memory_total = _memory_total()
        # NVML is opened at the first sample, on the flusher thread: never in a log() call.
        self._gpus: Any = None
        self._gpus_tried = os.environ.get("LOCAL_RANK", "0") != "0"  # one process per node

    def due(self, now: float) -> bool:
        return now >= self._next

    def sample(self, now: float) -> dict[str, Any]:
        self._next = now + self.interval
        out: dict[str, Any] = {}
        stats = [(pid, _stat(pid)) for pid in _tree(os.getpid())]
        alive = [(pid, s) for pid, s in stats if s is not None]
        if alive:
            cpu = sum(s[1] for _, s in alive)
            if self._last is not None and now > self._last[0]:
                out["cpu"] = max(0.0, 100.0 * (cpu - self._last[1]) / (now - self._last[0]))
            self._last = (now, cpu)
            rss = sum(_rss(pid) for pid, _ in alive)
            out["proc.memory.rssMB"] = rss / 2**20
            if self._memory_total:
                out["proc.memory.percent"] = 100.0 * rss / self._memory_total
            out["proc.cpu.threads"] = sum(s[2] for _, s in alive)
        if not self._gpus_tried:
            self._gpus_tried = True
            self._gpus = _nvml()
        if self._gpus is not None:
            out.update(self._gpus())
        return out


def _nvml() -> Any:
    """A function reading every GPU of this node, or None (no pynvml, no driver, no GPU)."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # not installed, no driver, no device: nothing GPU here
        return None
    if not handles:
        return None

    def read() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, handle in enumerate(handles):
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                out[f"gpu.{i}.gpu"] = util.gpu
                out[f"gpu.{i}.memory"] = util.memory
                out[f"gpu.{i}.memoryAllocated"] = 100.0 * memory.used / max(memory.total, 1)
                out[f"gpu.{i}.memoryAllocatedBytes"] = memory.used
                out[f"gpu.{i}.powerWatts"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                out[f"gpu.{i}.temp"] = pynvml.nvmlDeviceGetTemperature(
                    handle, pynvml.NVML_TEMPERATURE_GPU
                )
            except Exception:  # one GPU's read failing must not stop the others
                continue
        return out

    return read


_sampler: Sampler | None = None
_sampler_pid: int | None = None


def start(interval: float) -> None:
    """Sample this process from now on (idempotent); ``interval`` <= 0 turns it off."""
    global _sampler, _sampler_pid
    if interval > 0 and _sampler_pid != os.getpid():
        _sampler, _sampler_pid = Sampler(interval), os.getpid()


def tick(stream: Any, now: float) -> None:
    """Send a sample through ``stream`` when one is due (the flusher thread's call)."""
    sampler = _sampler
    if sampler is None or _sampler_pid != os.getpid() or not sampler.due(now):
        return
    values = sampler.sample(now)
    if values:
        # The logger labels it with the rank it knows this stream by (rank{r}-{host}).
        frame = codec.encode_update(STATS, {"host": _HOST, "stats": values}, 1 << 20)
        stream.send_side(frame)  # never waits; a sample that does not fit is skipped
