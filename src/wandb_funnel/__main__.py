"""``python -m wandb_funnel``: the ``wandb-funnel`` command."""

import sys

from wandb_funnel.cli import main

sys.exit(main())
