"""Does a run's console log reach the server once, or doubled? (issue 34, item 8)

One online run's console log on the server was once seen with every line twice, once with a
timestamp. This script runs a small job online N times against one OpenWandb server (on
127.0.0.1, behind a recording ``FaultProxy``), reads back the ``output.log`` the SERVER
stored for each run, and counts every line the job printed.

    nice -n 10 python soak/online_console_repeat.py [--runs 20] [--plain-runs 4] [--keep]

The job (``user`` below, run as ``wandb-funnel run -- python THIS user ...``, or as plain
``python THIS user ... --plain``): the owner calls ``wandb.init``, prints ``LINES`` numbered
lines to stdout and a few to stderr, spawns one worker that (under the funnel) calls
``wandb.init`` and prints its own numbered lines; every other run ends with ``finish()``,
the others leave it to the exit hook. Plain wandb captures the owner only (its worker does
not call ``wandb.init``), so only the owner's lines are expected there.

What OpenWandb 0.5.25 keeps as ``output.log`` (``tests/online/openwandb.py``): the
filestream's console lines, each as wandb-core sent it (``<ISO timestamp> <line>``, stderr
``ERROR <timestamp> <line>``), APPENDED as they arrive, offsets ignored; and the ``output.log``
file wandb uploads at finish (no timestamps), which REPLACES the file. So a stored line is
"doubled, once with timestamps" exactly when a filestream request carrying it was stored
after the upload. The proxy records, per run, when each filestream ``output.log`` chunk and
each ``output.log`` upload went through the server, so each run's verdict says which.

Measured 2026-11-29 (wandb 0.31.0, OpenWandb 0.5.25): every run, funnel (20 of 20) and plain
(4 of 4) alike, finish() or not. wandb-core uploads ``output.log`` at finish BEFORE its last
filestream request (the one with ``complete``), so the lines of that last request, all of a
run shorter than the 15 s filestream interval, follow the upload with their timestamps. With
``--pause 20`` only the tail is doubled (lines sent mid-run are overwritten by the upload).
The run's own ``output.log`` and the filestream both carry each line once: the doubling is
OpenWandb's storage, not the funnel's (W&B keeps the streamed log and the file apart).

Per run it prints one line; at the end a summary (JSON with ``--json FILE``). Exit status 1
if any funnel run had a printed line missing, or doubled in a way the upload/filestream
order does not explain.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import multiprocessing as mp
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
LINES = 20  # numbered stdout lines of each process
ERR_LINES = 3  # numbered stderr lines of the owner
# A filestream console line as OpenWandb stores it: wandb-core's timestamp (stderr: "ERROR "
# first), then the line.
STAMPED = re.compile(r"^(ERROR )?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z? ?(.*)$")
LABEL = re.compile(r"^\[rank \d+\] ")
MARK = re.compile(r"\b(?:owner|worker|stderr) line \d+ of [0-9a-f]+\b")


# ---- the job ----------------------------------------------------------------------------------
def _worker(token: str, funnel: bool) -> None:
    import wandb

    run = wandb.init() if funnel else None  # installed: attaches to the owner's run
    for i in range(LINES):
        print(f"worker line {i:02d} of {token}", flush=True)
    if run is not None:
        run.finish()


def user(token: str, finish: bool, plain: bool, pause: float) -> None:
    import wandb

    run = wandb.init(project=os.environ.get("WANDB_PROJECT"))
    pathlib.Path(os.environ["CONSOLE_REPEAT_ID_FILE"]).write_text(run.id)
    for i in range(LINES):
        print(f"owner line {i:02d} of {token}", flush=True)
        if i == LINES // 2 - 1 and pause:
            time.sleep(pause)  # the first half goes out in a filestream request of its own
    for i in range(ERR_LINES):
        print(f"stderr line {i:02d} of {token}", file=sys.stderr, flush=True)
    proc = mp.get_context("spawn").Process(target=_worker, args=(token, not plain))
    proc.start()
    proc.join(120)
    run.log({"x": 1})
    if finish:
        run.finish()


# ---- the proxy that remembers output.log ------------------------------------------------------
def recording_proxy(upstream_port: int) -> Any:
    sys.path.insert(0, str(REPO))
    from tests.online.fault_proxy import FILESTREAM, FaultProxy

    class RecordingProxy(FaultProxy):
        """A healthy proxy that also notes, per run, each ``output.log`` filestream chunk
        (offset, lines) and each ``output.log`` upload, with when the server handled it."""

        def __init__(self, port: int) -> None:
            super().__init__(port)
            self.console: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
            self._note_lock = threading.Lock()

        def _forward(self, method: str, path: str, headers: Any, body: bytes) -> Any:
            t0 = time.monotonic()
            answer = super()._forward(method, path, headers, body)
            t1 = time.monotonic()
            ok = answer is not None and 200 <= answer[0] < 300
            bare = path.split("?", 1)[0]
            fs = FILESTREAM.fullmatch(bare)
            event: dict[str, Any] | None = None
            if fs and ok:
                try:
                    raw = (
                        gzip.decompress(body) if headers.get("Content-Encoding") == "gzip" else body
                    )
                    files = json.loads(raw).get("files") or {}
                except (ValueError, OSError, AttributeError):
                    files = {}
                out = files.get("output.log")
                if out:
                    run_id = fs.group(3)
                    event = {
                        "kind": "stream",
                        "offset": out.get("offset", 0),
                        "lines": list(out.get("content") or []),
                    }
            elif method == "PUT" and bare.endswith("/output.log") and ok:
                run_id = bare.split("/")[-2]
                event = {"kind": "upload", "bytes": len(body)}
            if event is not None:
                event.update(t0=t0, t1=t1)
                with self._note_lock:
                    self.console[run_id].append(event)
            return answer

    return RecordingProxy(upstream_port).start()


# ---- one run ------------------------------------------------------------------------------------
def expected(token: str, funnel: bool) -> set[str]:
    lines = {f"owner line {i:02d} of {token}" for i in range(LINES)}
    lines |= {f"stderr line {i:02d} of {token}" for i in range(ERR_LINES)}
    if funnel:
        lines |= {f"worker line {i:02d} of {token}" for i in range(LINES)}
    return lines


def count_lines(text: str, token: str) -> dict[str, collections.Counter[str]]:
    """Our numbered lines in a stored output.log: ``plain`` (the upload's form) and
    ``stamped`` (the filestream's form), label and timestamp taken off."""
    found: dict[str, collections.Counter[str]] = {
        "plain": collections.Counter(),
        "stamped": collections.Counter(),
    }
    for stored in text.splitlines():
        form, line = "plain", stored
        stamped = STAMPED.match(stored)
        if stamped:
            form, line = "stamped", stamped.group(2)
        mark = MARK.search(LABEL.sub("", line))
        if mark and token in mark.group(0):
            found[form][mark.group(0)] += 1
    return found


def one(
    server: Any, proxy: Any, variant: str, finish: bool, scratch: pathlib.Path, pause: float
) -> dict[str, Any]:
    funnel = variant == "funnel"
    token = uuid.uuid4().hex[:8]
    project = f"console-repeat-{variant}"
    wandb_dir = scratch / f"{variant}-{token}"
    wandb_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(server.env(proxy.url))
    # The run's id as the job reports it (wandb-funnel 2026-11-29 ignores WANDB_RUN_ID).
    id_file = wandb_dir / "run_id"
    env.update(
        WANDB_PROJECT=project,
        WANDB_DIR=str(wandb_dir),
        TMPDIR=str(wandb_dir),
        PYTHONUNBUFFERED="1",
        WANDB_SILENT="true",
        CONSOLE_REPEAT_ID_FILE=str(id_file),
    )
    job = [
        sys.executable,
        __file__,
        "user",
        token,
        "--finish" if finish else "--no-finish",
        "--pause",
        str(pause),
    ]
    argv = (
        [sys.executable, "-m", "wandb_funnel", "run", "--", *job] if funnel else [*job, "--plain"]
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, cwd=wandb_dir, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    elapsed = time.monotonic() - t0
    if not id_file.is_file():
        raise RuntimeError(
            f"{variant} job exited {proc.returncode} before its run opened:\n" + proc.stderr[-3000:]
        )
    run_id = id_file.read_text().strip()
    stored = server.wait_for_run(
        project, run_id, lambda r: r.state == "finished" and r.output_log is not None, timeout=30
    )
    time.sleep(1.0)  # a straggling filestream request would land now
    text = server.run(project, run_id).output_log or ""
    found = count_lines(text, token)
    want = expected(token, funnel)
    total = found["plain"] + found["stamped"]
    missing = sorted(want - set(total))
    doubled = sorted(k for k in want if total[k] > 1)
    shapes = collections.Counter(
        f"{found['plain'][k]} plain + {found['stamped'][k]} stamped" for k in doubled
    )
    # What the run itself wrote (the file wandb uploaded), and the order on the server.
    local = list(wandb_dir.glob(f"wandb/*run-*-{run_id}/files/output.log"))
    local_counts = (
        count_lines(local[0].read_text(errors="replace"), token)["plain"] if local else None
    )
    events = proxy.console.get(run_id, [])
    uploads = [e for e in events if e["kind"] == "upload"]
    streams = [e for e in events if e["kind"] == "stream"]
    last_upload = max((e["t0"] for e in uploads), default=None)
    after_upload = [e for e in streams if last_upload is not None and e["t0"] >= last_upload]
    resent = 0  # filestream lines sent again at an offset already sent (a changed line)
    seen_to = 0
    for e in sorted(streams, key=lambda e: e["t0"]):
        resent += max(0, min(seen_to, e["offset"] + len(e["lines"])) - e["offset"])
        seen_to = max(seen_to, e["offset"] + len(e["lines"]))
    return {
        "variant": variant,
        "finish": finish,
        "run_id": run_id,
        "rc": proc.returncode,
        "elapsed_s": round(elapsed, 1),
        "state": stored.state,
        "expected": len(want),
        "missing": len(missing),
        "doubled": len(doubled),
        "doubled_shapes": dict(shapes),
        "stored_plain_lines": sum(found["plain"].values()),
        "stored_stamped_lines": sum(found["stamped"].values()),
        "local_file_doubled": None
        if local_counts is None
        else sum(1 for v in local_counts.values() if v > 1),
        "local_file_lines": None if local_counts is None else sum(local_counts.values()),
        "uploads": len(uploads),
        "stream_chunks": len(streams),
        "stream_lines": sum(len(e["lines"]) for e in streams),
        "stream_lines_resent": resent,
        "chunks_after_upload": len(after_upload),
        "lines_after_upload": sum(len(e["lines"]) for e in after_upload),
        "stderr_tail": proc.stderr[-1500:] if proc.returncode else "",
        "example": missing[:2] or doubled[:2],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="funnel runs")
    parser.add_argument("--plain-runs", type=int, default=4, help="plain wandb runs")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="the owner sleeps this long after half its lines (past wandb's "
        "15 s filestream interval, e.g. 20: the first half is sent before finish)",
    )
    parser.add_argument("--json", default=None, help="write every run's result here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from tests.online.openwandb import OpenWandb

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="console-repeat-"))
    server = OpenWandb(scratch / "server")
    proxy = None
    results: list[dict[str, Any]] = []
    try:
        server.start()
        proxy = recording_proxy(server.port)
        plan = [("funnel", i % 2 == 0) for i in range(args.runs)]
        plan += [("plain", i % 2 == 0) for i in range(args.plain_runs)]
        for n, (variant, finish) in enumerate(plan, 1):
            r = one(server, proxy, variant, finish, scratch, args.pause)
            results.append(r)
            print(
                f"{n:2d} {variant:6s} finish={finish!s:5s} rc={r['rc']} {r['elapsed_s']}s "
                f"missing={r['missing']} doubled={r['doubled']} {r['doubled_shapes']} "
                f"stored plain/stamped={r['stored_plain_lines']}/{r['stored_stamped_lines']} "
                f"chunks={r['stream_chunks']} after_upload={r['chunks_after_upload']} "
                f"({r['lines_after_upload']} lines) resent={r['stream_lines_resent']} "
                f"local_doubled={r['local_file_doubled']}",
                flush=True,
            )
            if r["stderr_tail"]:
                print(r["stderr_tail"], flush=True)
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    unexplained = 0
    for variant in ("funnel", "plain"):
        rs = [r for r in results if r["variant"] == variant]
        if not rs:
            continue
        bad = [r for r in rs if r["doubled"]]
        # Explained: each doubled line is once as uploaded and once as a filestream line
        # stored after the upload; the run's own file has every line once.
        explained = [
            r
            for r in bad
            if set(r["doubled_shapes"]) == {"1 plain + 1 stamped"}
            and r["chunks_after_upload"]
            and not r["local_file_doubled"]
        ]
        if variant == "funnel":
            unexplained += sum(1 for r in rs if r["missing"] or r["local_file_doubled"])
            unexplained += len(bad) - len(explained)
        print(
            f"{variant}: {len(rs)} runs, {len(bad)} with doubled lines "
            f"({len(explained)} of them explained: each doubled line once as uploaded, once "
            f"from a filestream request stored after the upload), "
            f"{sum(1 for r in rs if r['missing'])} with missing lines, "
            f"{sum(1 for r in rs if r['local_file_doubled'])} with doubled lines in the "
            f"uploaded file itself"
        )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if unexplained else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "user":
        p = argparse.ArgumentParser()
        p.add_argument("mode")
        p.add_argument("token")
        p.add_argument("--finish", action=argparse.BooleanOptionalAction, default=True)
        p.add_argument("--plain", action="store_true")
        p.add_argument("--pause", type=float, default=0.0)
        a = p.parse_args()
        user(a.token, a.finish, a.plain, a.pause)
    else:
        sys.exit(main())
