"""``save``'s paths (issue 34, item 2): ``_worker/files.plan_save`` resolves a glob,
``base_path`` and policy as wandb 0.31's own ``Run.save`` does, checked against wandb's code
itself (its ``save`` unwrapped, its ``_expand_glob`` / ``_find_literal``) case by case; the
staging of what it found, and the files that cannot be staged, counted; the logger's side,
which puts each file at its name and has wandb save the same glob there. End to end against
plain wandb: tests/processes/test_saving.py."""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import Any

import pytest
import wandb
from wandb.sdk import wandb_run

from wandb_funnel._logger.media import MediaFiles
from wandb_funnel._worker import files, media
from wandb_funnel.errors import FunnelWarning
from wandb_funnel.sinks.refs import BadMediaError
from wandb_funnel.sinks.wandb.media import log_files

# The reference is the installed wandb's own save, through its helpers (``_expand_glob``,
# ``_find_literal``: wandb 0.28.1 and later, with save's glob= keyword). An older wandb's save
# has other helpers; the funnel keeps the newest rules on every wandb
# (docs/guide/compatibility.md), so there is nothing of an older one's to compare here.
if not hasattr(wandb_run.Run, "_expand_glob"):
    pytest.skip(
        f"wandb {wandb.__version__}'s save predates glob= and _expand_glob: the funnel's save "
        "follows the newest wandb's rules, compared here on wandb 0.28.1 and later",
        allow_module_level=True,
    )
from wandb.sdk.lib.filesystem import validate_glob_path

WandbRun = wandb_run.Run


def _unwrapped(fn: Any) -> Any:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


class _PlainSave:
    """wandb's ``Run.save`` up to its links: what it would link (names under the run's
    files, in its order) and what it finds there already."""

    save = _unwrapped(WandbRun.save)

    def __init__(self, files_root: pathlib.Path) -> None:
        self.files_root = files_root

    def _save(
        self,
        glob_path: pathlib.PurePath,
        base_path: pathlib.PurePath,
        policy: str,
        expand_glob: bool = True,
    ) -> tuple[list[str], list[str]]:
        validate_glob_path(glob_path, base_path)
        relative = glob_path.relative_to(base_path)
        find = WandbRun._expand_glob if expand_glob else WandbRun._find_literal
        found, existing = find(base_path, relative, self.files_root)
        names = [str(pathlib.PurePath(*src.parts[len(base_path.parts) :])) for src in found]
        return names, sorted(str(p.relative_to(self.files_root)) for p in existing)


@pytest.fixture
def tree(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A working directory with the files a training script saves, and a run's files/."""
    work = tmp_path / "work"
    for name in (
        "models/abc/model.zip",
        "ckpt/run1/a.bin",
        "ckpt/run1/b.bin",
        "ckpt/run1/deep/c.bin",
        "logs/one.txt",
        "logs/two.txt",
        "logs/.hidden.txt",
        "weird[1].txt",
        "pre/x.txt",
        "prefix/x.txt",
        "abs/dir/final.pt",
    ):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(name)
    (tmp_path / "files" / "logs").mkdir(parents=True)
    (tmp_path / "files" / "logs" / "old.txt").write_text("in the run already")
    monkeypatch.chdir(work)
    return work


def _cases(work: pathlib.Path) -> list[tuple[Any, Any, str, bool]]:
    final = str(work / "abs" / "dir" / "final.pt")
    return [
        ("models/abc/model.zip", "models/abc", "live", True),  # SB3's WandbCallback
        (os.path.join("models", "abc", "model.zip"), pathlib.Path("models/abc"), "now", True),
        ("ckpt/run1/*.bin", "ckpt", "now", True),
        ("ckpt/**/*.bin", None, "live", True),  # not recursive: ** is *
        ("ckpt/run1/*", "ckpt", "end", True),  # a directory matches too
        ("logs/*.txt", None, "end", True),  # hidden files left out; the run's old.txt found
        ("./logs/./one.txt", None, "live", True),
        ("models/../models/abc/model.zip", "models", "live", True),  # .. normalised
        (final, None, "live", True),  # absolute: one folder kept, and a warning
        (str(work / "abs" / "*" / "*.pt"), str(work), "now", True),
        (b"logs/one.txt", None, "live", True),
        (pathlib.Path("logs/two.txt"), None, "live", True),
        ("weird[1].txt", None, "live", True),  # matches nothing: wandb's hint
        ("weird[1].txt", None, "live", False),  # literally
        ("nothing[2].txt", None, "live", False),  # and its hint the other way
        ("no-such-dir/*.bin", None, "live", True),  # nothing, silently
        ("gs://bucket/model.zip", None, "live", True),  # said, not saved
        # wandb's errors
        ("../outside/*.bin", None, "live", True),
        ("ckpt", "ckpt", "live", True),
        ("ckpt/*", "ckpt", "live", True),
        ("logs/one.txt", None, "sometimes", True),
        (final, None, "sometimes", True),  # warned first, then raised
        ("prefix/x.txt", "pre", "live", True),  # a string prefix, not a parent
    ]


def _resolve_both(
    tree: pathlib.Path, case: tuple[Any, Any, str, bool], monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    glob_str, base_path, policy, expand = case
    said: list[files.Note] = []
    monkeypatch.setattr(
        wandb, "termwarn", lambda text, repeat=True: said.append(files.Note("warn", text, repeat))
    )
    monkeypatch.setattr(
        wandb, "termlog", lambda text, repeat=True: said.append(files.Note("log", text, repeat))
    )
    files_root = tree.parent / "files"
    try:
        plain: Any = _PlainSave(files_root).save(glob_str, base_path, policy, expand)
    except ValueError as exc:
        plain = f"ValueError: {exc}"
    if plain == []:  # a cloud URL
        plain = None
    notes: list[files.Note] = []
    try:
        plan = files.plan_save(glob_str, base_path, policy, expand, notes)
        ours: Any = plan and (
            [n for n, _ in plan.sources],
            files.already_in_run(str(files_root), plan),
        )
    except ValueError as exc:
        ours = f"ValueError: {exc}"
    return (plain, said), (ours, notes)


def test_plan_save_resolves_every_case_as_wandbs_own_save(
    tree: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for case in _cases(tree):
        plain, ours = _resolve_both(tree, case, monkeypatch)
        assert ours == plain, case


def test_plan_save_names_what_a_training_script_saves(
    tree: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The names wandb gives (read off the parity above, spelled out)."""

    def names(glob_str: str, base_path: str | None, policy: str, expand: bool) -> Any:
        notes: list[files.Note] = []
        try:
            plan = files.plan_save(glob_str, base_path, policy, expand, notes)
        except ValueError as exc:
            return str(exc)
        assert plan is not None
        return [name for name, _ in plan.sources]

    assert names("models/abc/model.zip", "models/abc", "live", True) == ["model.zip"]
    assert names("ckpt/run1/*.bin", "ckpt", "now", True) == ["run1/a.bin", "run1/b.bin"]
    assert names("logs/*.txt", None, "end", True) == ["logs/one.txt", "logs/two.txt"]
    assert names(str(tree / "abs/dir/final.pt"), None, "live", True) == ["dir/final.pt"]
    assert names("../x/*.bin", None, "live", True) == "Glob may not walk above the base path"
    assert names("x", None, "never", True) == (
        'Only "live", "end" and "now" policies are currently supported.'
    )
    notes: list[files.Note] = []
    with pytest.raises(ValueError, match="policies"):
        files.plan_save(str(tree / "abs/dir/final.pt"), None, "never", True, notes)
    assert [n.text[:28] for n in notes] == ["Saving files without folders"]  # said first


def test_save_update_stages_each_file_and_names_what_it_could_not(
    tree: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    os.symlink(tree / "gone.bin", tree / "ckpt" / "run1" / "z.bin")  # dangling
    notes: list[files.Note] = []
    plan = files.plan_save("ckpt/run1/*", "ckpt", "now", True, notes)
    assert plan is not None
    stager = media.Stager(str(tmp_path / "staging"), 1 << 20)
    os.mkdir(tmp_path / "staging")
    enc = stager.encoding()
    data, failed = files.save_update(stager, plan, "now", enc)
    assert [entry for entry, _ in data["entries"]] == ["run1/a.bin", "run1/b.bin"]
    assert data["glob"] == "run1/*" and data["expand"] is True and data["policy"] == "now"
    assert [entry for entry, _ in failed] == ["run1/deep", "run1/z.bin"]
    assert "FileNotFoundError" in failed[1][1]
    staged = sorted(os.listdir(tmp_path / "staging"))
    assert staged == sorted(name for _, name in data["entries"])  # nothing partial left
    assert len(enc.staged) == 2

    # Another node: nothing staged, every file named, and the logger counts each.
    remote = media.Stager(None, 1 << 20, remote=True)
    data, failed = files.save_update(remote, plan, "now", remote.encoding())
    assert data["entries"] == [] and len(failed) == 4
    assert all("another node" in why for _, why in failed[:1])
    logger = MediaFiles(str(tmp_path / "staging"), lambda message: None)
    logger.log_files(files.not_saved_update(failed), sink=None)
    assert logger.dropped_files == 4 and logger.files == 0


class _FakeRun:
    def __init__(self, directory: pathlib.Path) -> None:
        self.dir = str(directory)
        self.saved: list[tuple[str, str, str, bool]] = []

    def save(self, path: str, base_path: str, policy: str, glob: bool) -> None:
        self.saved.append((path, base_path, policy, glob))


def test_the_logger_puts_each_file_at_its_name_and_saves_the_glob_there(
    tmp_path: pathlib.Path,
) -> None:
    staging = MediaFiles(str(tmp_path / "staging"), lambda message: None)
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "1-1-0123abcd.bin").write_text("a")
    (tmp_path / "staging" / "1-2-0123abcd.bin").write_text("b")
    run = _FakeRun(tmp_path / "files")
    data = {
        "op": "save",
        "entries": [["run1/a.bin", "1-1-0123abcd.bin"], ["run1/b.bin", "1-2-0123abcd.bin"]],
        "policy": "live",
        "glob": "run1/*.bin",
        "expand": True,
    }
    log_files(data, staging, run, wandb=None)
    assert (tmp_path / "files" / "run1" / "a.bin").read_text() == "a"
    assert (tmp_path / "files" / "run1" / "b.bin").read_text() == "b"
    assert run.saved == [(run.dir + "/run1/*.bin", run.dir, "live", True)]
    for pattern in ("../x/*.bin", "/etc/*", "", "a/../../b", 3):
        with pytest.raises(BadMediaError):
            log_files({**data, "entries": [], "glob": pattern}, staging, run, wandb=None)
    assert len(run.saved) == 1


def test_wf_save_says_wandbs_lines_as_funnel_warnings() -> None:
    assert files.installed_wandb(object()) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files.say([files.copied_note(2)], None)
    said = "Copied 2 files into the W&B run directory; call wandb.save again to sync new files."
    assert [str(w.message) for w in caught] == [f"wandb_funnel: {said}"]
    assert caught[0].category is FunnelWarning
