"""The tests read ``.wandb`` files with the same reader the soak harness ships."""

from wandb_funnel.soak.runfile import WandbRun, find_runs, only_run, read_run, step_of

__all__ = ["WandbRun", "find_runs", "only_run", "read_run", "step_of"]
