"""``wandb.init`` keywords that act in the calling process, where the funnel cannot carry
them: each must warn once and be counted in the run's summary, never do nothing silently.

    python init_keywords.py wf-init     wf.init(sync_tensorboard=True, monitor_gym=True)
    python init_keywords.py installed   install(); wandb.init(monitor_gym=True,
                                        settings=wandb.Settings(capture_loggers=...))
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import wandb_funnel as wf


def main() -> None:
    scenario = sys.argv[1]
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if scenario == "wf-init":
            run = wf.init(project="kw", sync_tensorboard=True, monitor_gym=True)
            run.log({"x": 1})
            run.finish()
            patched: list[object] = []
        else:
            wf.install()
            import wandb

            loggers = {"mylog": "INFO"}
            # (a wandb.Settings where wandb has the setting, from 0.27; a dict before)
            settings: Any = (
                wandb.Settings(capture_loggers=loggers)
                if "capture_loggers" in wandb.Settings.model_fields
                else {"capture_loggers": loggers}
            )
            wandb.init(project="kw", monitor_gym=True, settings=settings)
            # monitor_gym acted here: wandb's gym patch is on this process's RecordVideo.
            patched = list(wandb.patched["gym"])
            wandb.log({"x": 1})
            wandb.finish()
        caught = [str(w.message) for w in seen if "wandb.init(" in str(w.message)]
    print("REPORT " + json.dumps({"warnings": caught, "gym_patched": patched}), flush=True)


if __name__ == "__main__":
    main()
