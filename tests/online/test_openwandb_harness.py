"""The OpenWandb harness's own logic, without a server: which executable it picks, that its venv
is made once under a lock, and that a failed install says why."""

from __future__ import annotations

import pathlib
import threading
import time

import pytest

from tests.online import openwandb
from tests.online.openwandb import OpenWandbUnavailableError, ensure_venv, openwandb_executable

pytestmark = pytest.mark.timeout(120)


def fake_venv(venv: pathlib.Path, requirements: pathlib.Path) -> pathlib.Path:
    """A venv as ensure_venv leaves it: bin/openwandb and the requirements' stamp."""
    exe = venv / "bin" / "openwandb"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (venv / ".requirements.sha256").write_text(openwandb._requirements_digest(requirements) + "\n")
    return exe


def test_the_variable_names_an_executable_or_a_venv(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("openwandb==0.5.25\n")
    exe = fake_venv(tmp_path / "v", requirements)
    monkeypatch.setenv(openwandb.ENV_VAR, str(exe))
    assert openwandb_executable() == exe
    monkeypatch.setenv(openwandb.ENV_VAR, str(tmp_path / "v"))
    assert openwandb_executable() == exe
    monkeypatch.setenv(openwandb.ENV_VAR, str(tmp_path / "nothing-here"))
    with pytest.raises(OpenWandbUnavailableError, match="names neither an openwandb executable"):
        openwandb_executable()


def test_a_venv_made_from_these_requirements_is_used_as_it_is(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("openwandb==0.5.25\n")
    exe = fake_venv(tmp_path / "v", requirements)
    installs: list[pathlib.Path] = []
    monkeypatch.setattr(openwandb, "_install", lambda venv, req, deadline: installs.append(venv))
    assert ensure_venv(tmp_path / "v", requirements) == exe
    assert installs == []
    requirements.write_text("openwandb==0.5.26\n")  # other requirements: made again
    ensure_venv(tmp_path / "v", requirements)
    assert installs == [tmp_path / "v"]


def test_concurrent_callers_install_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("openwandb==0.5.25\n")
    installs: list[float] = []

    def slow_install(venv: pathlib.Path, req: pathlib.Path, deadline: float) -> None:
        installs.append(time.monotonic())
        time.sleep(0.5)  # the other caller arrives meanwhile, and waits on the lock
        exe = venv / "bin" / "openwandb"
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")

    monkeypatch.setattr(openwandb, "_install", slow_install)
    got: list[pathlib.Path] = []
    threads = [
        threading.Thread(target=lambda: got.append(ensure_venv(tmp_path / "v", requirements)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(installs) == 1
    assert got == [tmp_path / "v" / "bin" / "openwandb"] * 3


def test_a_failed_install_raises_and_says_why(tmp_path: pathlib.Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("this is not a requirement ===\n")  # pip refuses it at once
    with pytest.raises(OpenWandbUnavailableError) as info:
        ensure_venv(tmp_path / "v", requirements, timeout=100)
    message = str(info.value)
    assert "installing OpenWandb" in message and "pip" in message
    assert openwandb.ENV_VAR in message  # and what to do instead
    assert not (tmp_path / "v").exists()  # nothing half-made is left to be taken as made
