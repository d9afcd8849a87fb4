"""The online harness proven with plain wandb (no funnel): what a run sends through the fault
proxy arrives on OpenWandb, healthy and across each filestream fault (a black hole, resets,
429 with wandb's rate-limit headers, 500, a delay); the server pauses and restarts."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

import pytest

from tests.conftest import Scripts, reports, wait_for_report
from tests.online.conftest import Online
from tests.online.fault_proxy import FaultProxy, rate_limit_headers

PLAIN_RUN = pathlib.Path(__file__).with_name("plain_run.py")
ROWS = 20

pytestmark = [pytest.mark.online, pytest.mark.processes]


def expected_row(step: int) -> dict[str, float]:
    return {"loss": 1.0 / (step + 1), "acc": step / 100}


def assert_every_row_arrived_once(online: Online, run_id: str, exit_code: int) -> None:
    run = online.run(run_id)
    assert run.steps == list(range(ROWS)), run.steps
    for got in run.history:
        want = expected_row(got["_step"])
        assert {k: got[k] for k in want} == want
    image = run.history[-1]["img"]
    assert image["_type"] == "image-file"
    assert run.files.get(image["path"]) == image["size"] > 0  # the media file was uploaded
    assert run.state == "finished"
    assert run.exit_code == exit_code
    assert online.proxy.history_lines()[run_id] == ROWS  # accepted by the server once each


@pytest.mark.timeout(150)
def test_a_healthy_run_arrives_whole_through_the_proxy(online: Online, scripts: Scripts) -> None:
    res = scripts.run_file(PLAIN_RUN, ["--rows", str(ROWS)], timeout=120, extra_env=online.env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not res.leftovers
    run_id = reports(res.stdout)["run_id"]
    assert online.run_ids() == [run_id]

    assert_every_row_arrived_once(online, run_id, exit_code=0)
    run = online.run(run_id)
    assert run.config == {"lr": 0.1, "layers": [64, 32], "nested": {"a": 1}}
    assert run.config_raw["lr"] == {"value": 0.1} and "_wandb" in run.config_raw
    last = expected_row(ROWS - 1)
    assert run.summary == {**last, "best": 42}  # the filestream's summary: scalars only
    assert run.summary_file is not None
    assert {k: run.summary_file[k] for k in ("loss", "acc", "best")} == {**last, "best": 42}
    assert run.summary_file["img"]["path"] == run.history[-1]["img"]["path"]
    assert {"output.log", "config.yaml", "wandb-summary.json", "wandb-metadata.json"} <= set(
        run.files
    )
    assert f"logged row {ROWS - 1}" in (run.output_log or "")
    assert "lr:" in run.read("config.yaml").decode()

    proxy = online.proxy
    assert proxy.requests("filestream") >= 1 and proxy.requests("graphql") >= 1
    assert proxy.requests("upload") >= 4  # summary, config, metadata, output.log, the image
    assert proxy.requests(faulted=True) == 0
    assert all(r.status is not None and r.status < 500 for r in proxy.records())
    for kind in ("graphql", "filestream", "upload"):
        assert proxy.bytes_up(kind) > 0 and proxy.bytes_down(kind) > 0
    assert proxy.completed_runs() == {run_id}


# Each fault, on the filestream only, while the second half of the rows goes out and finish()
# waits: it lasts 2.5 s past its first hit, then the proxy is healthy again.
FAULTS: dict[str, Callable[[FaultProxy], None]] = {
    "black_hole": lambda p: p.black_hole(only="filestream"),
    "reset": lambda p: p.reset(only="filestream"),
    "status_429": lambda p: p.status(
        429, rate_limit_headers(retry_after=1, remaining=0, reset=2), only="filestream"
    ),
    "status_500": lambda p: p.status(500, only="filestream"),
    "delay": lambda p: p.delay(3.0, only="filestream"),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_filestream_fault_mid_run_loses_no_row(
    online: Online, scripts: Scripts, tmp_path: pathlib.Path, fault: str
) -> None:
    go = tmp_path / "go"
    proc = scripts.start_file(
        PLAIN_RUN,
        ["--rows", str(ROWS), "--pause-after", str(ROWS // 2), "--go", str(go), "--exit-code", "7"],
        extra_env=online.env,
    )
    t0 = time.monotonic()
    seen = wait_for_report(proc, "paused_at", timeout=90)
    run_id = seen["run_id"]
    proxy = online.proxy

    # Half the rows are logged; now the filestream meets the fault, and the other half
    # follows (and finish()): wandb-core's next filestream request is the first to meet it.
    FAULTS[fault](proxy)
    go.touch()
    hit = proxy.wait_until(
        lambda: proxy.held() >= 1 or proxy.requests("filestream", faulted=True) >= 1, timeout=30
    )
    assert hit, proxy.stats()
    time.sleep(2.5)  # the fault stays a while, finish() waiting on it
    if fault != "delay":  # a delayed request does go through, the complete one among them
        assert online.run(run_id).state == "running"  # the complete request is kept out
    proxy.healthy()

    res = scripts.finish(proc, timeout=120, t0=t0)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not res.leftovers
    assert reports(res.stdout)["finish_s"] >= 2.0  # finish waited for the fault to go
    assert proxy.requests("filestream", faulted=True) >= 1
    assert proxy.requests("graphql", faulted=True) == 0  # only the filestream met it
    assert_every_row_arrived_once(online, run_id, exit_code=7)


@pytest.mark.timeout(120)
def test_the_server_pauses_resumes_and_comes_back_on_its_port_with_its_data(
    online: Online, scripts: Scripts
) -> None:
    res = scripts.run_file(PLAIN_RUN, ["--rows", "3"], timeout=90, extra_env=online.env)
    assert res.returncode == 0, res.stderr[-3000:]
    run_id = reports(res.stdout)["run_id"]
    server = online.server
    port = server.port
    pid = server.proc.pid if server.proc else None

    server.pause()
    assert not server.answers(timeout=1.0)
    server.resume()
    assert server.answers(timeout=10.0)

    server.restart(down_for=0.5)
    assert server.port == port and server.proc is not None and server.proc.pid != pid
    assert server.answers(timeout=10.0)
    assert online.run(run_id).steps == [0, 1, 2]  # the same data directory
