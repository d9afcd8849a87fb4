"""What a Run stages by name in the funnel's staging directory: its media (``media.py``), its
artifacts (``log_artifact``, ``log_model``) and its saved files (``save``; ``files.py`` resolves
them). One stager per (process, funnel); a file staged for a call that then fails is removed.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wandb_funnel._protocol.messages import FILES
from wandb_funnel._worker import files, media
from wandb_funnel._worker.run_updates import RunUpdates
from wandb_funnel.errors import FunnelWarning


class RunFiles(RunUpdates):
    """Media, artifacts and saved files of ``wf.Run`` (a base of it; ``Run`` holds the state)."""

    _stager: media.Stager | None

    if TYPE_CHECKING:

        @property
        def id(self) -> str: ...
        @property
        def dir(self) -> str: ...

    def _media_stager(self) -> media.Stager:
        stager = self._stager
        if stager is None or stager.pid != os.getpid():
            directory = media.staging_dir_for(self._info.address)
            stager = self._stager = media.Stager(
                directory, self._info.max_media_bytes, remote=directory is None
            )
        return stager

    @staticmethod
    def _blobs(records: media.RecordPacker) -> list[tuple[str, bytes]] | None:
        """From another node, the files' bytes of a record just packed, sent with it once the
        record is good (``Stream.push``), ahead of it: a file that does not fit the queue is
        then missing at the logger (counted)."""
        enc = records.take()
        return enc.blobs if enc is not None else None

    def log_artifact(
        self,
        artifact_or_path: Any,
        name: str | None = None,
        type: str | None = None,  # noqa: A002  (wandb's own argument name)
        aliases: list[str] | None = None,
        tags: list[str] | None = None,
    ) -> Any:
        """``wandb.Run.log_artifact`` from any rank: a file, a directory or a
        ``wandb.Artifact`` (its local files and references) becomes an artifact of the run.
        Returns the artifact it was given (None for a path).

        Raises:
            ValueError: a path that does not exist.
            TypeError: neither a path nor a wandb.Artifact.
        """
        self._send_files(
            "log_artifact",
            lambda stager, enc: files.artifact_update(
                stager, artifact_or_path, name, type, aliases, tags, self.id, enc
            ),
        )
        return None if isinstance(artifact_or_path, (str, os.PathLike)) else artifact_or_path

    def log_model(
        self, path: Any, name: str | None = None, aliases: list[str] | None = None
    ) -> None:
        """``wandb.Run.log_model``: a model artifact from a file or directory."""
        self.log_artifact(path, name=name, type="model", aliases=aliases)

    def save(
        self,
        glob_str: str | bytes | os.PathLike[str],
        base_path: str | os.PathLike[str] | None = None,
        policy: str = "live",
        glob: bool = True,
    ) -> bool | list[str]:
        """``wandb.Run.save`` from any rank, resolved as wandb 0.31 resolves it
        (``files.plan_save``): a relative glob and ``base_path`` from this process's working
        directory; the same errors, terminal lines and names in the run's files directory;
        and the same return value: those files' paths in ``run.dir`` (the logger puts them
        there just after the call).

        Each matching file is copied now, a snapshot, where wandb symlinks it; a later
        change reaches the run when ``save`` is called again (wandb's own advice when it has
        to copy). ``"live"`` and ``"now"``: the copy reaches the run now; ``"live"`` stays
        ``"live"`` in the run's records, as plain's. ``"end"``: the copy is uploaded when the
        run finishes (the file as it was at the call, not as it is at the end).

        A file that cannot be carried (from a rank on another node, a directory, a file
        gone or unreadable) is warned about here and counted in ``_funnel/dropped_files``;
        it is not in the returned list.

        Raises:
            ValueError: wandb's: a bad policy; a glob above, or the same as, ``base_path``,
                or that starts with ``*`` under it.
        """
        if self._finished:
            raise self._finished_error("save")
        return files.save(self, glob_str, base_path, policy, glob)

    def _send_files(
        self, what: str, make: Callable[[media.Stager, media.Encoding], dict[str, Any]]
    ) -> None:
        stager = self._media_stager()
        enc = stager.encoding()
        try:
            data = make(stager, enc)
        except files.FilesRefusedError as exc:
            warnings.warn(
                f"wandb_funnel: {what}() was not carried: {exc}", FunnelWarning, stacklevel=3
            )
            data = {"op": "refused", "what": what, "why": str(exc)}
        except BaseException:
            enc.rollback()
            raise
        try:
            sent = self._send_update(FILES, data)
        except BaseException:
            enc.rollback()
            raise
        if not sent:  # the queue was full: said by the stream; nothing of it stays staged
            enc.rollback()
