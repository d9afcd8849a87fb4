"""``wandb-funnel status [--json] [--watch]``: the running funnels of this user on this node.

The logger writes ``status.json`` in its private directory (``0700``, the owner's user: the
same rule as its socket) once a second, from counters it already keeps (``_logger/monitor``,
``Logger.status``): a reader never talks to the logger, so asking can never slow the job, and
the answer comes at once. A funnel whose file is older than ``STALE_AFTER`` seconds, or whose
logger is gone, is left out.

``--json`` prints ``{"funnels": [{"run_id", "name", "project", "owner_pid", "started",
"state", "rows", "pending_rows", "dropped", "close", "attempt", "ranks": [{"rank", "pid",
"host", "state", "last_step", "since_last_s", "records", "dropped", "steps_per_s"}]}]}``;
``attempt`` is ``{"job", "restart", "number"}`` for a run that is an attempt of a job
torchrun restarts or SLURM requeues (``_attempts.py``), else null. ``nodes`` is
``[{"node", "host", "logger_pid", "ranks", "state", "restarts", "forwarded", "stale",
"junk"}]`` in the node tier (issue 38: the root's node, whose logger is the funnel's, then
each node logger's; ``state`` is ``live``, ``ended`` or ``gone``; the counts are the node
logger's frames as of its last word, the second before), else null. These names are a
contract: scripts depend on them.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time
from typing import Any

from wandb_funnel import _private_dir
from wandb_funnel._pid import pid_alive

STALE_AFTER = 10.0
FUNNEL_KEYS = (
    "run_id",
    "name",
    "project",
    "owner_pid",
    "started",
    "state",
    "rows",
    "pending_rows",
    "dropped",
    "close",
    "attempt",
    "ranks",
    "nodes",
)
RANK_KEYS = (
    "rank",
    "pid",
    "host",
    "state",
    "last_step",
    "since_last_s",
    "records",
    "dropped",
    "steps_per_s",
)


def _alive(pid: Any) -> bool:
    return type(pid) is int and pid > 0 and pid_alive(pid)


def funnels(now: float | None = None) -> list[dict[str, Any]]:
    """Every running funnel of this user whose directory is under ``$TMPDIR`` or ``/tmp``."""
    now = time.time() if now is None else now
    uid = os.getuid()
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for base in dict.fromkeys((tempfile.gettempdir(), "/tmp")):
        for path in sorted(glob.glob(os.path.join(base, "wandb-funnel-*", _private_dir.STATUS))):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            try:
                if os.stat(os.path.dirname(path)).st_uid != uid:
                    continue  # another user's: never ours to read (it is 0700 anyway)
                with open(path) as f:
                    status = json.load(f)
            except (OSError, ValueError):
                continue  # being replaced, or gone with its funnel
            if not isinstance(status, dict):
                continue
            if now - float(status.get("updated") or 0) > STALE_AFTER:
                continue
            if not _alive(status.get("logger_pid")):
                continue
            out.append({key: status.get(key) for key in FUNNEL_KEYS})
    return out


def render(found: list[dict[str, Any]]) -> str:
    """The human-readable screen."""
    if not found:
        return "no running wandb-funnel of this user on this node"
    lines: list[str] = []
    for f in found:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f.get("started") or 0))
        lines.append(
            f"run {f['run_id']} ({f.get('name') or '-'}, project {f.get('project') or '-'}) "
            f"owner pid {f['owner_pid']}, started {started}: {f['state']}; rows {f['rows']}, "
            f"pending {f['pending_rows']}, dropped {f['dropped']}"
        )
        attempt = f.get("attempt")
        if attempt:
            lines.append(
                f"  attempt {attempt.get('number')} of this run: restart "
                f"{attempt.get('restart')} of {attempt.get('job')}"
            )
        close = f.get("close")
        if close:
            lines.append(
                f"  closing: {close.get('rows_left')} rows left, "
                f"{close.get('seconds_left', 0):.1f}s left of its budget"
            )
        for n in f.get("nodes") or []:
            lines.append(
                f"  node {n['node']} on {n['host']}: logger pid {n['logger_pid']}, "
                f"{n['state']}, ranks {n['ranks']}, restarts {n.get('restarts', 0)}, "
                f"forwarded {n.get('forwarded', 0)}, stale {n.get('stale', 0)}, "
                f"junk {n.get('junk', 0)}"
            )
        lines.append(
            f"  {'rank':>5} {'pid':>8} {'host':<16} {'state':<9} {'step':>8} "
            f"{'last(s)':>8} {'records':>9} {'dropped':>8} {'steps/s':>8}"
        )
        for r in f.get("ranks") or []:
            since = r.get("since_last_s")
            lines.append(
                f"  {r['rank']:>5} {r['pid']:>8} {str(r['host'])[:16]:<16} {r['state']:<9} "
                f"{r['last_step']:>8} {'-' if since is None else f'{since:.1f}':>8} "
                f"{r['records']:>9} {r['dropped']:>8} {r['steps_per_s']:>8.1f}"
            )
    return "\n".join(lines)


def main(as_json: bool, watch: bool, interval: float = 1.0) -> int:
    try:
        while True:
            found = funnels()
            if as_json:
                print(json.dumps({"funnels": found}), flush=True)
            else:
                if watch:
                    print("\x1b[2J\x1b[H", end="")  # clear the screen, as watch(1) does
                print(render(found), flush=True)
            if not watch:
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `wandb-funnel status --json --watch | head`
        sys.stderr.close()
        return 0
