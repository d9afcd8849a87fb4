"""The logger process, started by the owner (``_owner.logger_process.LOGGER_BOOTSTRAP``
imports this module without running the package's ``__init__``; ``python -m
wandb_funnel._logger`` works too, loading the public API for nothing). Its exit code is the
code the run was finished with."""

from wandb_funnel._logger.leave import leave
from wandb_funnel._logger.main import main

code = main()
# Exit without waiting on anything the wandb SDK left running: the run is finished, and a
# thread of wandb's must not hold the exit (the owner is waiting, bounded, for this process).
leave(code)
