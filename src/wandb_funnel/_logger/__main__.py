"""``python -m wandb_funnel._logger``: the logger process (started by the owner)."""

import os
import sys

from wandb_funnel._logger.process import main

main()
# Exit without waiting on anything the wandb SDK left running; the run is finished.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
