"""``wandb_funnel.install()`` in this process: what it patches, what it leaves alone, what it
puts back; the Run libraries get; and the startup hook that installs in child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import wandb

import wandb_funnel as wf
from wandb_funnel import _pid
from wandb_funnel._constants import ENV_INSTALL, ORIGINAL_ATTRIBUTE
from wandb_funnel._protocol import codec
from wandb_funnel._wandb_module import hooks
from wandb_funnel._wandb_module import install as installer
from wandb_funnel._wandb_module.wandb_run import as_installed
from wandb_funnel._worker.run import AttachInfo, Run
from wandb_funnel.errors import FunnelWarning


class FakeStream:
    """Takes what a Run sends, decoded (no socket)."""

    def __init__(self) -> None:
        self.pid = _pid.current
        self.records: list[dict[str, Any]] = []
        self.updates: list[Any] = []
        self.closed = False

    def push(self, frame: bytes, blobs: list[tuple[str, bytes]] | None = None) -> None:
        batch = codec.decode(codec.encode_batch(0, [frame]), 1 << 24)
        self.records += [data for _, _, data in batch.records]  # type: ignore[union-attr]

    def send_control(self, frame: bytes) -> None:
        self.updates.append(codec.decode(frame, 1 << 24))

    def close(self, reason: str, timeout: float, exit_code: int) -> None:
        self.closed = True


def _run() -> tuple[Run, FakeStream]:
    run = Run(AttachInfo("ipc:///nonexistent/x.sock", "token", "rid", 1 << 20), None)
    stream = FakeStream()
    run._stream = stream  # type: ignore[assignment]
    return run, stream


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV_INSTALL, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    for name in list(os.environ):
        if name.startswith("WANDB_FUNNEL_"):
            monkeypatch.delenv(name)
    wf.install(reduce="sum")
    try:
        yield
    finally:
        wf.uninstall()


def test_install_patches_the_run_api_and_leaves_the_rest(installed: None) -> None:
    original = getattr(wandb.init, ORIGINAL_ATTRIBUTE)
    assert original is not wandb.init and wandb.run is None
    assert wandb.init.__doc__ == original.__doc__
    # The rest of wandb is wandb's own.
    assert wandb.Settings.__module__.startswith("wandb.") and wandb.Api.__module__.startswith(
        "wandb."
    )
    # Idempotent: a second install keeps the patch, and takes the new options.
    patched = wandb.init
    wf.install(run_mode="shared")
    assert wandb.init is patched and installer._installed is not None
    assert installer._installed.options == {"run_mode": "shared"}
    # Processes started from here install too.
    assert json.loads(os.environ[ENV_INSTALL]) == {"run_mode": "shared"}
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [hooks.BOOTSTRAP_DIR, "/somewhere"]


def test_uninstall_puts_everything_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.delenv(ENV_INSTALL, raising=False)
    before = {name: getattr(wandb, name) for name in ("init", "finish", "login", "log", "run")}
    wf.install()
    wf.uninstall()
    wf.uninstall()  # twice: nothing to do
    assert {name: getattr(wandb, name) for name in before} == before
    assert os.environ["PYTHONPATH"] == "/somewhere" and ENV_INSTALL not in os.environ


def test_a_bad_option_is_refused_before_anything_is_patched() -> None:
    init = wandb.init
    with pytest.raises(ValueError, match="run_mode must be one of"):
        wf.install(run_mode="everything")
    assert wandb.init is init and not installer.is_installed()


def test_libraries_see_wandbs_run_class(installed: None) -> None:
    run, stream = _run()
    view: Any = as_installed(run, wandb)
    assert view is run and isinstance(view, wandb.sdk.wandb_run.Run) and isinstance(view, Run)
    view.define_metric("train/*", step_metric="train/step")
    assert stream.updates[-1].data == {"name": "train/*", "step_metric": "train/step"}
    view._label(code="transformers_trainer")  # private: silent
    with pytest.warns(FunnelWarning, match=r"run.alert\(\) does not go through the funnel"):
        view.alert("title", "text")
    view.alert("title", "text")  # warned once; counted each time
    assert stream.updates[-1].data == {"_funnel/unsupported_calls": 2}
    assert view.starting_step == 0 and view.resumed is False


def test_installed_log_leaves_out_what_it_cannot_carry_and_counts_it(installed: None) -> None:
    run, stream = _run()
    view: Any = as_installed(run, wandb)
    with pytest.warns(FunnelWarning, match="ndarray .*left out"):
        view.log({"arr": np.arange(3), "loss": 0.5})
    view.log({"arr": np.arange(2), "loss": 0.4})
    assert stream.records == [{"loss": 0.5}, {"loss": 0.4}]
    assert view.step == 2  # the step moved as in wandb
    assert stream.updates[-1].data == {"_funnel/dropped_values": 2}
    with pytest.raises(TypeError, match="keys must be str"):
        view.log({1: 2})  # the caller's error, not a value's


def test_finish_puts_the_module_back_to_pre_init(installed: None) -> None:
    state = installer._installed
    assert state is not None
    run, stream = _run()
    view: Any = as_installed(run, wandb)
    installer._set_globals(state, view)
    module: Any = wandb
    assert module.run is view and module.config is view.config and module.log == view.log
    module.config.update({"lr": 0.1})
    view.finish()
    assert stream.closed and wandb.run is None
    assert wandb.log is state.originals["log"] and wandb.config is state.originals["config"]


def test_login_offline_asks_for_nothing(
    installed: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb.login() is False  # what wandb's own login says offline
    assert "Unable to verify login in offline mode" in capsys.readouterr().err


def _python(code: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_the_startup_hook_installs_once_wandb_is_imported(tmp_path: Any) -> None:
    other = tmp_path / "theirs"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_FUNNEL_")}
    env["PYTHONPATH"] = os.pathsep.join([hooks.BOOTSTRAP_DIR, str(other)])
    env[ENV_INSTALL] = json.dumps({"reduce": "max"})
    # A process that never imports wandb does not pay for it; a sitecustomize we shadow runs.
    assert (
        _python("import sys, os; print('wandb' in sys.modules, os.environ.get('THEIRS_RAN'))", env)
        == "False 1"
    )
    # Asking for the spec first (HF and accelerate do) and importing later still installs.
    code = (
        "import importlib.util; importlib.util.find_spec('wandb'); import wandb; "
        "from wandb_funnel._wandb_module import install as i; "
        f"print(hasattr(wandb.init, {ORIGINAL_ATTRIBUTE!r}), i._installed.options)"
    )
    assert _python(code, env) == "True {'reduce': 'max'}"
    env.pop(ENV_INSTALL)
    assert _python(f"import wandb; print(hasattr(wandb.init, {ORIGINAL_ATTRIBUTE!r}))", env) == (
        "False"
    )


def test_a_process_that_never_calls_init_gets_no_exit_work(tmp_path: Any) -> None:
    """Issue 23, item 5: in timm's train.py under torchrun, rank 1 imports wandb (timm.utils
    does) but never calls wandb.init, and its interpreter exit is where torch's gloo process
    group is torn down. Installed, such a process must exit as it would without the funnel:
    no thread of ours, and no exit hook but the exit-code keeper, which is a no-op unless a
    signal handler chose a code during our own shutdown."""
    code = (
        "import atexit, json, threading\n"
        "hooks = []\n"
        "register = atexit.register\n"
        "def spy(f, *a, **k):\n"
        "    name = getattr(f, '__qualname__', repr(f))\n"
        "    hooks.append(f'{getattr(f, \"__module__\", None)}.{name}')\n"
        "    return register(f, *a, **k)\n"
        "atexit.register = spy\n"
        "import torch.distributed, wandb\n"  # in timm's order: torch, then timm.utils's wandb
        "print(json.dumps([sorted(hooks), sorted(t.name for t in threading.enumerate())]))\n"
    )
    plain = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_FUNNEL_")}
    plain.pop("PYTHONPATH", None)
    # Rank 1 of a torchrun job, as in timm's case (a top-level process of its own would
    # start a logger ahead of time at `import wandb`: tests/processes/test_prewarm.py).
    plain.update(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    installed = dict(plain, PYTHONPATH=hooks.BOOTSTRAP_DIR, **{ENV_INSTALL: "{}"})
    hooks_plain, threads_plain = json.loads(_python(code, plain))
    hooks_installed, threads_installed = json.loads(_python(code, installed))
    assert threads_installed == threads_plain
    ours = set(hooks_installed) - set(hooks_plain)
    assert ours == {
        "wandb_funnel._worker.lifecycle._keep_exit_code",
        "zmq.sugar.context._notice_atexit",
    }, ours


def test_installed_run_sets_name_notes_and_tags_as_wandbs_run_does(
    installed: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain code (and Lightning's ``logger.experiment.name = ...``) sets them on the installed
    Run: no AttributeError; bad tags get wandb's own warning; a finished run wandb's error."""
    run, stream = _run()
    view: Any = as_installed(run, wandb)
    view.name, view.notes, view.tags = "renamed", "notes", ["a"]
    assert (view.name, view.notes, view.tags) == ("renamed", "notes", ("a",))
    assert [u.data for u in stream.updates] == [
        {"name": "renamed"},
        {"notes": "notes"},
        {"tags": ["a"]},
    ]
    capsys.readouterr()
    view.tags = [""]
    assert "Invalid tag detected: Tag at index 0 is empty" in capsys.readouterr().err
    assert view.tags == ("a",) and len(stream.updates) == 3
    view._finished = True
    with pytest.raises(
        wandb.errors.UsageError, match=r"Run \(rid\) is finished. The call to `name`"
    ):
        view.name = "late"
