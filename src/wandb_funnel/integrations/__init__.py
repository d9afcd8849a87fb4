"""Drop-in replacements for the frameworks' own wandb loggers (``integrations.lightning``)."""
