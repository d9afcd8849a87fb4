"""``wandb.save`` as real programs call it: plain wandb code, run as it is (``python saving.py``)
and through the funnel (``wandb-funnel run -- python saving.py``), from the directory that
will hold its files. Reports what each call returned (paths relative to ``run.dir``) or
raised.

- Stable-Baselines3's ``WandbCallback(model_save_path=...)``: a nested file, ``base_path`` its
  directory, relative;
- a glob with ``base_path`` (two files in a subdirectory), policy "now";
- a relative glob without ``base_path`` (folders kept), policy "end";
- an absolute path without ``base_path`` (one folder kept, and wandb's warning);
- a glob matching nothing; a file the program wrote into ``run.dir`` itself, saved by a name
  that matches nothing in the working directory (wandb saves the run's own copy);
- wandb's errors: a glob above its base, the base itself, a bad policy;
- last, a dangling symlink: plain wandb links it (a file that will never upload); the funnel
  cannot copy it, so it warns and counts it.
"""

from __future__ import annotations

import os
from typing import Any

import wandb
from _prelude import report


def write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def main() -> None:
    model_save_path = os.path.join("models", "abc")
    write(os.path.join(model_save_path, "model.zip"), "weights")
    write(os.path.join("ckpt", "run1", "a.bin"), "a")
    write(os.path.join("ckpt", "run1", "b.bin"), "b")
    write(os.path.join("ckpt", "run1", "skip.txt"), "not a .bin")
    write(os.path.join("logs", "one.txt"), "one")
    write(os.path.join("logs", "two.txt"), "two")
    final = os.path.abspath(write(os.path.join("abs", "dir", "final.pt"), "final"))

    run = wandb.init(project="saving", name="saving")
    write(os.path.join(run.dir, "notes.txt"), "written into the run")
    calls: dict[str, Any] = {
        "sb3": lambda: wandb.save(
            os.path.join(model_save_path, "model.zip"), base_path=model_save_path
        ),
        "glob-base": lambda: wandb.save("ckpt/run1/*.bin", base_path="ckpt", policy="now"),
        "glob-relative": lambda: run.save("logs/*.txt", policy="end"),
        "absolute": lambda: wandb.save(final),
        "nothing": lambda: wandb.save("no-such-dir/*.bin"),
        "in-run": lambda: wandb.save("notes.txt"),
        "above": lambda: wandb.save("../elsewhere/*.bin"),
        "same": lambda: wandb.save("ckpt", base_path="ckpt"),
        "star": lambda: wandb.save("ckpt/*", base_path="ckpt"),
        "policy": lambda: wandb.save("logs/one.txt", policy="sometimes"),  # type: ignore[arg-type]
    }
    seen: dict[str, Any] = {}
    for name, call in calls.items():
        try:
            seen[name] = sorted(os.path.relpath(p, run.dir) for p in call())
        except ValueError as exc:
            seen[name] = f"ValueError: {exc}"
    os.symlink(os.path.abspath("gone.bin"), "broken.bin")
    broken: Any = wandb.save("broken.bin")
    seen["broken"] = [os.path.relpath(p, run.dir) for p in broken]
    report(saved=seen)
    run.finish()


if __name__ == "__main__":
    main()
