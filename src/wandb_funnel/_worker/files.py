"""``run.log_artifact`` and ``run.save`` from any rank: the files are copied into the staging
directory by name (a snapshot at the call, as wandb's own ``add_file`` copies at the call) and a
FILES update tells the logger what to make of them: an artifact of the run, or files in its
directory.

Files are not held to ``max_media_bytes`` or the in-flight bound: they are the user's own files,
not media. A rank on another node than the logger has no staging directory: the call
warns and is counted (``funnel/dropped_files``).
"""

from __future__ import annotations

import os
from typing import Any

from wandb_funnel._worker.media import Encoding, Stager


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


def save_update(
    stager: Stager, glob_str: str, base_path: str | None, policy: str, enc: Encoding
) -> dict[str, Any]:
    """The FILES update for ``save(glob_str, base_path, policy)``: every matching file, kept
    at its path relative to ``base_path`` (the glob's own directory by default, as wandb)."""
    if policy not in ("live", "now", "end"):
        raise ValueError(
            f'wandb_funnel: save policy must be "live", "end" or "now", got {policy!r}'
        )
    import glob  # here: a worker that never saves does not load it

    pattern = os.fspath(glob_str)
    if base_path is None:
        base_path = os.path.dirname(pattern) if os.path.isabs(pattern) else "."
    base = os.path.abspath(base_path)
    entries = []
    for path in sorted(
        glob.glob(
            pattern if os.path.isabs(pattern) else os.path.join(base, pattern), recursive=True
        )
    ):
        if os.path.isfile(path):
            entry = os.path.relpath(os.path.abspath(path), base)
            if entry.startswith(".."):
                raise ValueError(f"wandb_funnel: save: {path!r} is not under base_path {base!r}")
            entries.append([entry, _stage(stager, path, enc)])
    # "live" re-uploads a file each time it changes: the funnel copies it once, now.
    return {"op": "save", "entries": entries, "policy": "now" if policy == "live" else policy}


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
