"""``run.log_artifact`` and ``run.save`` from any rank: the files are copied into the staging
directory by name (a snapshot at the call, as wandb's own ``add_file`` copies at the call) and a
FILES update tells the logger what to make of them: an artifact of the run, or files in its
directory.

``save`` resolves its glob, ``base_path`` and policy as wandb 0.31's ``Run.save`` does
(``plan_save``, pure but for the filesystem it globs), and the logger saves the same glob under
the run's files directory once the copies are there, so that the run's files and its ``files``
records name what plain wandb's would.

Files are not held to ``max_media_bytes`` or the in-flight bound: they are the user's own files,
not media. A file that cannot be carried (a rank on another node than the logger has no
staging directory; a file that cannot be copied) is warned about at the call and counted
(``_funnel/dropped_files``).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

from wandb_funnel._protocol.messages import FILES
from wandb_funnel._worker import console
from wandb_funnel._worker.media import Encoding, Stager
from wandb_funnel.errors import FunnelWarning

if TYPE_CHECKING:
    import pathlib

    from wandb_funnel._worker.run_files import RunFiles


class FilesRefusedError(ValueError):
    """A log_artifact or save that cannot be carried from here (no staging directory)."""


def _stage(stager: Stager, path: str, enc: Encoding) -> str:
    if stager.directory is None:  # another node: a checkpoint is not sent as bytes
        raise FilesRefusedError(
            "this rank is on another node than the logger; artifacts and saved files do not "
            "cross nodes yet"
        )
    return stager.stage_file(path, os.path.splitext(path)[1], enc, checked=False)


def artifact_update(
    stager: Stager,
    artifact_or_path: Any,
    name: str | None,
    type: str | None,  # noqa: A002  (wandb's own argument name)
    aliases: list[str] | None,
    tags: list[str] | None,
    run_id: str,
    enc: Encoding,
) -> dict[str, Any]:
    """The FILES update for ``log_artifact(artifact_or_path, ...)``, its files staged."""
    if isinstance(artifact_or_path, (str, os.PathLike)):
        path = os.fspath(artifact_or_path)
        if not os.path.exists(path):
            raise ValueError(f"wandb_funnel: log_artifact: no file or directory at {path!r}")
        files = _walk(path)
        data: dict[str, Any] = {
            "name": name or f"run-{run_id}-{os.path.basename(os.path.normpath(path))}",
            "type": type or "unspecified",
            "entries": [[entry, _stage(stager, src, enc)] for entry, src in files],
            "refs": [],
        }
    elif type_name(artifact_or_path) == "Artifact":
        artifact = artifact_or_path
        entries, refs = [], []
        for entry, item in artifact.manifest.entries.items():
            if getattr(item, "ref", None):
                refs.append([entry, str(item.ref)])
            elif getattr(item, "local_path", None):
                entries.append([entry, _stage(stager, str(item.local_path), enc)])
        data = {
            "name": name or artifact.name.split(":")[0],
            "type": type or artifact.type,
            "description": artifact.description,
            "metadata": dict(artifact.metadata or {}),
            "entries": entries,
            "refs": refs,
        }
    else:
        raise TypeError(
            f"wandb_funnel: log_artifact takes a path or a wandb.Artifact, got "
            f"{type_name(artifact_or_path)}"
        )
    data.update(op="artifact", aliases=list(aliases or []), tags=list(tags or []))
    return data


class Note(NamedTuple):
    """A line wandb prints at a ``save`` call: ``termwarn`` (``level`` "warn") or ``termlog``
    ("log"); ``repeat`` False: once a process."""

    level: str
    text: str
    repeat: bool = True


class SavePlan(NamedTuple):
    """What ``save`` resolved, as wandb 0.31's ``Run.save`` / ``Run._save`` resolve it."""

    base: str  # the absolute base path
    relative: str  # the glob (or, ``expand`` False, the literal path) under ``base``
    expand: bool
    sources: list[tuple[str, str]]  # (name in the run's files, absolute source), wandb's order


def plan_save(
    glob_str: str | bytes | os.PathLike[str],
    base_path: str | os.PathLike[str] | None,
    policy: str,
    expand_glob: bool,
    notes: list[Note],
) -> SavePlan | None:
    """Resolve ``save(glob_str, base_path, policy, glob=expand_glob)`` exactly as wandb 0.31
    does, from this process's working directory: its errors (ValueError, worded as wandb's),
    and its terminal lines appended to ``notes`` in wandb's order (a warning wandb prints
    before raising is in ``notes`` when this raises). None: a cloud URL, which wandb only
    logs (it saves nothing and returns ``[]``).

    - A relative ``glob_str`` is relative to the working directory, and so is
      ``base_path`` (default: the working directory).
    - An absolute ``glob_str`` without ``base_path`` keeps one directory level (its base is
      the glob's grandparent), with wandb's "Saving files without folders" warning.
    - ``..`` is normalised (``os.path.abspath``) before the glob must lie under the base:
      "Glob may not walk above the base path", "Glob cannot be the same as the base path",
      "Glob may not start with '*' relative to the base path".
    - The glob is Python's ``glob.glob`` (not recursive: ``**`` is ``*``; a directory that
      matches is a source too); a glob that matches nothing saves nothing, with wandb's
      warning when a file exists at that literal path (``glob=False`` takes it literally).
    """
    import pathlib

    if isinstance(glob_str, bytes):
        glob_str = glob_str.decode("utf-8")
    if isinstance(glob_str, str) and glob_str.startswith(("gs://", "s3://")):
        notes.append(Note("log", f"{glob_str} is a cloud storage url, can't save file to W&B."))
        return None
    glob_path = pathlib.PurePath(glob_str)
    resolved_glob = pathlib.PurePath(os.path.abspath(glob_path))
    base: os.PathLike[str] | str
    if base_path is not None:
        base = pathlib.Path(base_path)
    elif not glob_path.is_absolute():
        base = pathlib.Path(".")
    else:
        notes.append(
            Note(
                "warn",
                "Saving files without folders. If you want to preserve subdirectories pass "
                'base_path to wandb.save, i.e. wandb.save("/mnt/folder/file.h5", '
                'base_path="/mnt")',
                repeat=False,
            )
        )
        base = resolved_glob.parent.parent
    if policy not in ("live", "end", "now"):
        raise ValueError('Only "live", "end" and "now" policies are currently supported.')
    resolved_base = pathlib.PurePath(os.path.abspath(base))
    # wandb.sdk.lib.filesystem.validate_glob_path, then PurePath.relative_to (whose own
    # ValueError a base that is a string prefix but not a parent, "/a/b" of "/a/bc", gets).
    if not str(resolved_glob).startswith(str(resolved_base)):
        raise ValueError("Glob may not walk above the base path")
    if resolved_glob == resolved_base:
        raise ValueError("Glob cannot be the same as the base path")
    relative = resolved_glob.relative_to(resolved_base)
    if relative.parts and relative.parts[0] == "*":
        raise ValueError("Glob may not start with '*' relative to the base path")

    found = _matches(str(resolved_base / relative), str(relative), expand_glob, notes)
    depth = len(resolved_base.parts)
    sources = [(str(pathlib.PurePath(*src.parts[depth:])), str(src)) for src in found]
    return SavePlan(str(resolved_base), str(relative), expand_glob, sources)


def save(
    run: RunFiles,
    glob_str: str | bytes | os.PathLike[str],
    base_path: str | os.PathLike[str] | None,
    policy: str,
    glob: bool,
) -> list[str]:
    """``run.save(...)`` (``wf.Run.save`` says what it does): resolved by ``plan_save``, each
    file staged and a FILES update sent; the paths in ``run.dir`` that wandb would return."""
    import pathlib

    wandb = installed_wandb(run)
    notes: list[Note] = []
    try:
        plan = plan_save(glob_str, base_path, policy, glob, notes)
    finally:
        say(notes, wandb)  # what wandb prints before raising, too
    if plan is None:
        return []  # a cloud URL: wandb says so and saves nothing
    stager = run._media_stager()
    files_root = run.dir if stager.directory is not None else ""  # its node only
    existing = already_in_run(files_root, plan)
    enc = stager.encoding()
    try:
        data, failed = save_update(stager, plan, policy, enc)
        sent = stager.directory is None or run._send_update(FILES, data)
    except BaseException:
        enc.rollback()
        raise
    if not sent:  # the queue was full: said by the stream; nothing of it stays staged
        enc.rollback()
        return []
    if data["entries"] and wandb is not None:  # where wandb says "Symlinked 1 file ..."
        say([copied_note(len(data["entries"]))], wandb)
    if failed:
        update = not_saved_update(failed)
        warnings.warn(
            f"wandb_funnel: save({os.fspath(glob_str)!r}): {update['why']}; counted in "
            f"the run's summary as _funnel/dropped_files",
            FunnelWarning,
            stacklevel=3,  # the user's call of run.save
        )
        run._send_update(FILES, update)
    names = {pathlib.PurePath(entry) for entry, _ in data["entries"]}
    names.update(pathlib.PurePath(name) for name in existing)
    return [os.path.join(files_root, name) for name in sorted(names)]


def _matches(
    literal: str, relative: str, expand_glob: bool, notes: list[Note]
) -> list[pathlib.Path]:
    """What ``save``'s glob matches (``literal``: the glob as an absolute path), with wandb's
    warnings for a glob that matches nothing but a file of that name, and a literal path that
    is not there but looks like a glob."""
    import glob as globbing  # here: a worker that never saves does not load it
    import pathlib

    if expand_glob:
        found = [pathlib.Path(p).absolute() for p in sorted(globbing.glob(literal))]
        if not found and os.path.lexists(literal):
            notes.append(
                Note(
                    "warn",
                    f"No files found at glob pattern {relative!r}, but a file exists at "
                    "that literal path. If you meant to match it literally rather than as a "
                    "glob pattern, call save() with glob=False.",
                    repeat=False,
                )
            )
    elif os.path.lexists(literal):
        found = [pathlib.Path(literal).absolute()]
    else:
        found = []
        if globbing.escape(relative) != relative:
            notes.append(
                Note(
                    "warn",
                    f"No file found at literal path {literal!r}, and it looks like it contains "
                    "glob metacharacters ('*', '?', or '[]'). If you meant to use a glob "
                    "pattern, call save() with glob=True (the default).",
                    repeat=False,
                )
            )
    return found


def already_in_run(files_root: str, plan: SavePlan) -> list[str]:
    """The names in the run's files directory ``files_root`` (on this node) that ``plan``'s
    glob matches there already: wandb saves those again too (and returns them)."""
    import pathlib

    root = pathlib.Path(files_root)
    if not files_root or not root.is_dir():
        return []
    if not plan.expand:
        return [plan.relative] if os.path.lexists(root / plan.relative) else []
    try:
        return sorted(str(p.relative_to(root)) for p in root.glob(plan.relative))
    except (OSError, ValueError, NotImplementedError):
        return []  # a pattern pathlib does not take (wandb's own save would raise there)


def save_update(
    stager: Stager, plan: SavePlan, policy: str, enc: Encoding
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The FILES update for ``plan``: each source staged (a snapshot, now), to be put at its
    name in the run's files directory; and the sources that could not be staged, with why
    (a rank on another node, a directory, a file gone or unreadable): the caller warns and
    has them counted. The logger saves the plan's glob under the run's files directory once
    the files are there, so that wandb itself publishes them and whatever else it matches
    there, as a plain ``save`` does."""
    entries: list[list[str]] = []
    failed: list[tuple[str, str]] = []
    for entry, src in plan.sources:
        if stager.directory is None:
            failed.append((entry, "this rank is on another node than the logger"))
        elif os.path.isdir(src):
            failed.append((entry, "a directory (save the files in it: a glob)"))
        else:
            staged = len(enc.staged)
            try:
                entries.append([entry, stager.stage_file(src, _ext(src), enc, checked=False)])
            except OSError as exc:
                for path in enc.staged[staged:]:  # a partial copy
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                del enc.staged[staged:]
                failed.append((entry, f"{type(exc).__name__}: {exc.strerror or exc}"))
    data = {
        "op": "save",
        "entries": entries,
        "policy": policy,
        "glob": plan.relative,
        "expand": plan.expand,
    }
    return data, failed


def not_saved_update(failed: list[tuple[str, str]]) -> dict[str, Any]:
    """The FILES update that has the logger count (``_funnel/dropped_files``, one a file) and
    name the files a ``save`` could not carry: entries without a staged file."""
    why = "; ".join(f"{entry}: {reason}" for entry, reason in failed[:5])
    more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
    return {
        "op": "refused",
        "what": "save",
        "why": f"{len(failed)} file(s) not saved: {why}{more}",
        "entries": [[entry, None] for entry, _ in failed],
    }


def copied_note(copied: int) -> Note:
    """wandb's line for files it copied into the run (where it symlinks, it says so)."""
    return Note(
        "warn",
        f"Copied {copied} file{'s' if copied > 1 else ''} into the W&B run directory; call "
        "wandb.save again to sync new files.",
    )


def installed_wandb(run: Any) -> Any:
    """The wandb module, where ``run`` is an installed run (an instance of wandb's Run: the
    process imported wandb, this does not); None for the funnel's own ``wf.Run``."""
    wandb = sys.modules.get("wandb")
    cls = getattr(wandb, "Run", None)
    return wandb if isinstance(cls, type) and isinstance(run, cls) else None


def say(notes: list[Note], wandb: Any) -> None:
    """wandb's terminal lines for a ``save``: printed by wandb itself for an installed run
    (``wandb``), as wandb prints them; a FunnelWarning each for ``wf.Run.save``."""
    for note in notes:
        if wandb is not None:
            term = wandb.termlog if note.level == "log" else wandb.termwarn
            with console.uncaptured():  # as plain wandb's: on the terminal, not in the Logs
                term(note.text, repeat=note.repeat)
        else:
            # At the user's call: run.save -> files.save -> say.
            warnings.warn(f"wandb_funnel: {note.text}", FunnelWarning, stacklevel=4)


def _ext(path: str) -> str:
    return os.path.splitext(path)[1]


def _walk(path: str) -> list[tuple[str, str]]:
    """(name in the artifact, file) for a file, or every file under a directory."""
    if os.path.isfile(path):
        return [(os.path.basename(path), path)]
    out = []
    for root, _, names in os.walk(path):
        for name in sorted(names):
            full = os.path.join(root, name)
            out.append((os.path.relpath(full, path), full))
    return sorted(out)


def type_name(value: Any) -> str:
    return type(value).__name__
