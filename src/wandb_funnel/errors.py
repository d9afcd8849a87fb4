"""The exceptions wandb-funnel raises, sorted by whose fault it is."""

from __future__ import annotations

__all__ = [
    "ClientClosedError",
    "FunnelError",
    "FunnelWarning",
    "LoggerStartError",
    "LoggerUnavailableError",
]


class FunnelError(Exception):
    """Base class for every error raised by wandb-funnel itself."""


class ClientClosedError(FunnelError):
    """*You* closed it: the Run or Funnel was finished, and then used again."""


class LoggerUnavailableError(FunnelError):
    """The *other side* failed: the logger process is gone, or never answered (a launched
    rank attaching to a logger that its hosting rank already closed, or that is stuck)."""


class LoggerStartError(LoggerUnavailableError):
    """The logger process could not start or open its wandb run (in a launched job: the
    hosting rank failed, and every other rank gets its error)."""


class FunnelWarning(UserWarning):
    """Something was lost or cut short; the message says what and why."""
