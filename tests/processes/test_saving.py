"""``wandb.save`` through the funnel is plain wandb's (issue 34, item 2): the same program
(``tests/programs/saving.py``: the SB3 pattern, globs with and without ``base_path``, an
absolute path, wandb's errors) runs with plain wandb and under ``wandb-funnel run --``, and
what both saw and wrote is compared: the calls' return values and errors, the run's
``files`` records, the files in its ``files/`` directory and wandb's warnings. The resolution
itself is tests/test_saving_paths.py's."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from wandb.sdk import wandb_run

from tests.conftest import Scripts, leftover_processes, program, reports, side_by_side
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

FUNNEL_RUN = [sys.executable, "-m", "wandb_funnel", "run", "--"]
# What wandb itself writes into a run's files/ (compared elsewhere, or not comparable).
WANDBS_OWN = {
    "output.log",
    "requirements.txt",
    "config.yaml",
    "wandb-metadata.json",
    "wandb-summary.json",
}


def _saving(
    scripts: Scripts, *launcher: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], WandbRun]:
    # wandb speaks as it does for a user (the tests' environment silences it elsewhere).
    command = [*launcher, sys.executable, str(program("saving"))]
    proc = scripts.run_command(command, {"WANDB_SILENT": "false"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = find_runs(scripts.wandb_dir)
    return proc, reports(proc.stdout)["saved"], run


def _files_dir(run: WandbRun) -> dict[str, str | None]:
    """The user's files under the run's files/, with their text (None: a dangling link)."""
    root = run.path.parent / "files"
    return {
        path.relative_to(root).as_posix(): path.read_text() if path.exists() else None
        for path in sorted(root.rglob("*"))
        if not path.is_dir() and path.relative_to(root).as_posix() not in WANDBS_OWN
    }


def _warnings(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("wandb: WARNING")]


def test_save_resolves_paths_globs_and_base_path_as_plain_wandb(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``wandb.save(os.path.join(path, "model.zip"), base_path=path)`` (SB3) saved nothing
    through the funnel, and said nothing (issue 34): every call now returns what plain's
    returns, raises what plain's raises, and leaves the same files under the same names; a
    file the funnel cannot copy (a dangling link, which plain links anyway) is warned about
    and counted."""
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain"))
    (proc, saw, funnel), (plain_proc, plain_saw, plain) = side_by_side(
        lambda: _saving(scripts, *FUNNEL_RUN), lambda: _saving(plain_scripts)
    )
    assert plain_saw.pop("broken") == ["broken.bin"] and saw.pop("broken") == []
    assert saw == plain_saw
    assert plain_saw["sb3"] == ["model.zip"]
    assert plain_saw["glob-base"] == ["run1/a.bin", "run1/b.bin"]
    assert plain_saw["glob-relative"] == ["logs/one.txt", "logs/two.txt"]
    assert plain_saw["absolute"] == ["dir/final.pt"]
    assert plain_saw["in-run"] == ["notes.txt"]
    assert plain_saw["star"] == "ValueError: Glob may not start with '*' relative to the base path"

    # The run's files records, in order, and the files themselves. (Before wandb 0.28.1 a
    # glob's files are recorded in a set's order, plain wandb's as well: compared sorted.)
    assert plain.files[-1] == "broken.bin"
    if hasattr(wandb_run.Run, "_expand_glob"):
        assert funnel.files == plain.files[:-1]
    else:
        assert sorted(funnel.files) == sorted(plain.files[:-1])
    assert "model.zip" in funnel.files and "run1/a.bin" in funnel.files
    plain_files = _files_dir(plain)
    assert plain_files.pop("broken.bin") is None
    assert _files_dir(funnel) == plain_files
    assert plain_files["model.zip"] == "weights" and plain_files["dir/final.pt"] == "final"

    # wandb's warnings at the calls: the funnel copies where plain symlinks, and says so.
    plain_warnings = [w.replace("Symlinked", "Copied") for w in _warnings(plain_proc)]
    assert any("Saving files without folders" in w for w in plain_warnings)
    from wandb.sdk.lib import filesystem

    if hasattr(filesystem, "LinkStats"):  # wandb 0.23.1 on; before, other words (the funnel
        # says the newest wandb's: docs/guide/compatibility.md)
        copied_one = "Copied 1 file into the W&B run directory; call wandb.save again to sync"
        assert plain_warnings[-1] == f"wandb: WARNING {copied_one} new files."  # dangling link
        assert _warnings(proc) == plain_warnings[:-1]

    # The file the funnel could not copy: warned about at the call, counted, never silent.
    assert "save('broken.bin'): 1 file(s) not saved: broken.bin" in proc.stderr
    assert funnel.summary["_funnel/dropped_files"] == 1
    assert funnel.summary["_funnel/files"] == 6  # the six files it copied
    assert not leftover_processes(scripts.mark)
