"""The logger's exit removes the temporary directories a normal exit would have (its
``os._exit`` skips their finalizers): every ``TemporaryDirectory`` still alive, and only
those. In a child process: in this one it would remove other tests' (and wandb's own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, os, tempfile
from wandb_funnel._logger.leave import remove_temp_dirs
kept = tempfile.mkdtemp()  # not a TemporaryDirectory: not ours to remove
made = [tempfile.TemporaryDirectory(suffix="wandb-media") for _ in range(2)]
with open(os.path.join(made[0].name, "x.png"), "wb") as fh:
    fh.write(b"png")  # a file left in one: removed with it
first, again = remove_temp_dirs(), remove_temp_dirs()
gone = [not os.path.exists(d.name) for d in made]
print(json.dumps({"first": first, "again": again, "gone": gone, "kept": os.path.isdir(kept)}))
os.rmdir(kept)
"""


def test_every_live_temporary_directory_is_removed_and_nothing_else() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"TMPDIR": tmp, "PATH": "/usr/bin:/bin"}
        out = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
        ).stdout
        seen = json.loads(out)
        assert seen == {"first": 2, "again": 0, "gone": [True, True], "kept": True}
        assert os.listdir(tmp) == []
