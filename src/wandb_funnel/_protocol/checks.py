"""What ``log()`` accepts, checked at the call site: str keys all the way down, no raw bytes,
nesting within ``MAX_NESTING``, steps within 63 bits. Each error names the key at fault (and
is worded for the caller: the run would otherwise lose the row later, far from the call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

MAX_STEP: Final = 2**63 - 1
# The deepest nesting of dicts and lists log() accepts. Invariant: what log() accepts, the
# logger's decoder accepts (a refused frame loses its whole batch). msgpack's unpacker counts
# Python recursion, and the receiver thread starts deeper in the stack than a caller; 256 is
# far deeper than any metrics dict and far below both limits (docs/DESIGN.md, "Wire").
MAX_NESTING: Final = 256


_BINARY = (bytes, bytearray, memoryview)


def _binary_error(path: str, value: Any) -> TypeError:
    return TypeError(
        f"wandb_funnel: cannot log {type(value).__name__} value for key {path!r}: wandb "
        f"cannot store raw bytes (decode it to str, or log a number)"
    )


def _nesting_error(path: str) -> ValueError:
    return ValueError(
        f"wandb_funnel: value for key {path!r} is nested more than {MAX_NESTING} levels deep "
        f"(or contains itself)"
    )


def _check_list(items: Any, path: str, depth: int) -> None:
    if depth > MAX_NESTING:
        raise _nesting_error(path)
    for item in items:
        if isinstance(item, _BINARY):
            raise _binary_error(path, item)
        if isinstance(item, Mapping):
            _check_keys(item, path, depth + 1)
        elif isinstance(item, (list, tuple)):
            _check_list(item, path, depth + 1)


def _check_keys(data: Mapping[Any, Any], path: str, depth: int = 0) -> None:
    """Keys must be str all the way down; raw bytes are refused (msgpack would carry them,
    but wandb cannot store them, so the row would be lost later, far from the call)."""
    if depth > MAX_NESTING:
        raise _nesting_error(path)
    for key, value in data.items():
        if type(key) is not str:
            where = f" in {path!r}" if path else ""
            raise TypeError(
                f"wandb_funnel: keys must be str, got {type(key).__name__} key {key!r}{where}"
            )
        kind = type(value)
        if kind in (int, float, str, bool) or value is None:
            continue  # the common case, checked first
        full = f"{path}.{key}" if path else key
        if isinstance(value, Mapping):
            _check_keys(value, full, depth + 1)
        elif isinstance(value, (list, tuple)):
            _check_list(value, full, depth + 1)
        elif isinstance(value, _BINARY):
            raise _binary_error(full, value)


FLAT = frozenset({int, float, str, bool, type(None)})


def check_data(data: Any, what: str = "log data") -> dict[str, Any]:
    """Validate a user dict at the call site and return it as a plain dict."""
    if type(data) is dict:
        # The hot path: a flat dict of str keys and plain scalars needs no walk (one log()
        # of 3 scalars spent most of its 6 us here).
        for key, value in data.items():
            if type(key) is not str or type(value) not in FLAT:
                break
        else:
            return data
    if not isinstance(data, Mapping):
        raise TypeError(f"wandb_funnel: {what} must be a dict, got {type(data).__name__}")
    try:
        _check_keys(data, "")
    except RecursionError:
        # A dict or list that contains itself, or nesting deeper than the interpreter's
        # recursion limit: RecursionError escaped log() before (a RuntimeError, not the
        # documented TypeError/ValueError).
        raise ValueError(
            f"wandb_funnel: {what} is nested too deeply (or contains itself)"
        ) from None
    return data if type(data) is dict else dict(data)


def check_step(step: Any) -> int:
    """Validate an explicit ``step=`` argument: a non-negative int that fits in 63 bits."""
    if type(step) is int and 0 <= step <= MAX_STEP:
        return step  # the hot path
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise TypeError(f"wandb_funnel: step must be an int, got {type(step).__name__} {step!r}")
    value = step.__index__()
    if value < 0 or value > MAX_STEP:
        raise ValueError(f"wandb_funnel: step must be between 0 and 2**63-1, got {value!r}")
    return int(value)
