"""``run.config`` and ``run.summary``: local mirrors that behave like wandb 0.31's, and send each
change to the logger, which applies it to the one wandb run.

``Config`` follows ``wandb.sdk.wandb_config.Config``: attribute and item access, ``update(d,
allow_val_change=None)``, ``setdefaults``, keys stripped of ``-``, and values stored as wandb
stores them (JSON-friendly: int dict keys become str, tuples become lists, objects their
``str``). Changing a key's value without ``allow_val_change`` raises, as wandb does. No wandb
import here: a worker that never imports wandb still has ``run.config``.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from wandb_funnel._protocol import codec


class ConfigError(ValueError):
    """A config value changed without ``allow_val_change=True`` (wandb raises its own
    ``ConfigError`` for the same thing; an installed ``wandb`` raises that one)."""


def _jsonable_default(value: Any) -> Any:
    for method in ("tolist", "item"):  # numpy arrays and scalars, torch tensors
        convert = getattr(value, method, None)
        if callable(convert):
            try:
                return convert()
            except (TypeError, ValueError, RuntimeError):
                pass
    if hasattr(value, "__dataclass_fields__"):
        return {name: getattr(value, name) for name in value.__dataclass_fields__}
    return str(value)  # what wandb's json_friendly_val stores for other objects


def jsonable(value: Any) -> Any:
    """``value`` as wandb's config stores it: through JSON (int keys become str), and no deeper
    than what the wire carries (a deeper value would be refused by wandb in the logger, far
    from the call, so it is refused here)."""
    if type(value) in (int, float, str, bool) or value is None:
        return value
    try:
        stored = json.loads(json.dumps(value, default=_jsonable_default, allow_nan=True))
        codec.check_data({"value": stored}, "config value")
    except RecursionError:
        raise ValueError(
            "wandb_funnel: config value is nested too deeply (or contains itself)"
        ) from None
    except ValueError as exc:  # json: a circular reference; codec: nested too deeply
        raise ValueError(
            f"wandb_funnel: config value {reprlib.repr(value)} cannot be stored: {exc}"
        ) from exc
    except TypeError as exc:
        raise TypeError(
            f"wandb_funnel: config value {reprlib.repr(value)} cannot be stored: {exc}"
        ) from exc
    return stored


def parse_config(data: Any, what: str = "config") -> dict[str, Any]:
    """A dict from what ``wandb.config.update`` accepts: a mapping, a config (``keys()``), an
    ``argparse.Namespace`` or any object with attributes (``vars``)."""
    if data is None:
        return {}
    if isinstance(data, Mapping):
        return dict(data)
    if callable(getattr(data, "keys", None)) and hasattr(data, "__getitem__"):
        return {k: data[k] for k in data.keys()}  # noqa: SIM118  # keys() skips "_" keys
    if hasattr(data, "__dict__"):
        return {k: v for k, v in vars(data).items() if not k.startswith("_")}
    raise TypeError(
        f"wandb_funnel: {what} must be a dict, a Namespace or an object with attributes, "
        f"got {type(data).__name__}"
    )


class Config:
    """``run.config``."""

    def __init__(
        self, send: Callable[[dict[str, Any]], None], error: type[Exception] = ConfigError
    ) -> None:
        object.__setattr__(self, "_items", {})
        object.__setattr__(self, "_send", send)
        object.__setattr__(self, "_error", error)

    def _sanitize(self, key: Any, value: Any, allow_val_change: bool | None) -> tuple[str, Any]:
        if not isinstance(key, str):
            raise TypeError(f"wandb_funnel: config keys must be str, got {key!r}")
        key = key.strip("-")
        value = jsonable(value)
        items: dict[str, Any] = self._items
        if not allow_val_change and key in items and items[key] != value:
            raise self._error(
                f'Attempted to change value of key "{key}" from {items[key]} to {value}\n'
                "If you really want to do this, pass allow_val_change=True to config.update()"
            )
        return key, value

    def _apply(self, data: dict[str, Any]) -> None:
        items: dict[str, Any] = self._items
        changed = {k: v for k, v in data.items() if k not in items or items[k] != v}
        if changed:
            self._send(changed)
            items.update(changed)

    def _seed(self, data: dict[str, Any]) -> None:
        """What the run was opened with: known here, not sent again."""
        self._items.update(data)

    def update(self, d: Any, allow_val_change: bool | None = None) -> None:
        clean = dict(self._sanitize(k, v, allow_val_change) for k, v in parse_config(d).items())
        self._apply(clean)

    def setdefaults(self, d: Any) -> None:
        """Set the keys of ``d`` that are not set yet."""
        new = {k: v for k, v in parse_config(d).items() if k not in self._items}
        self._apply(dict(self._sanitize(k, v, True) for k, v in new.items()))

    def __setitem__(self, key: str, value: Any) -> None:
        self._apply(dict([self._sanitize(key, value, None)]))

    __setattr__ = __setitem__

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __getattr__(self, key: str) -> Any:
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(f"config has no key {key!r}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def keys(self) -> list[str]:
        return [k for k in self._items if not k.startswith("_")]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in self._items.items() if not k.startswith("_")]

    def as_dict(self) -> dict[str, Any]:
        return dict(self._items)

    def __repr__(self) -> str:
        return repr(self._items)


class Summary:
    """``run.summary``: what this process set (values wandb keeps from ``log`` are in the run,
    not mirrored here)."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._items: dict[str, Any] = {}
        self._send = send

    def update(self, d: Any = None, **kwargs: Any) -> None:
        data = {**parse_config(d, "summary"), **kwargs}
        if data:
            data = codec.check_data(data, "summary")
            self._send(data)
            self._items.update(data)

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __setattr__(self, key: str, value: Any) -> None:
        if key.startswith("_"):
            object.__setattr__(self, key, value)
        else:
            self.update({key: value})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(f"summary has no key {key!r}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def keys(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._items.items())

    def __repr__(self) -> str:
        return repr(self._items)


# -- run.name, run.notes, run.tags: the three attributes wandb 0.31's Run lets a user set -------
# wandb keeps them in its pydantic Settings (validated on assignment); what it takes and what
# it refuses is mirrored here, without wandb.
_TAG_LENGTH = "Tags must be between 1 and 64 characters"


def _as_str(value: Any) -> str | None:
    """``value`` as pydantic's lax ``str`` takes it (bytes decoded); None where it refuses."""
    if isinstance(value, str):
        return str.__str__(value)  # a subclass's text, as a plain str
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return None


def run_text(attr: str, value: Any) -> str | None:
    """``value`` as ``run.name = value`` (or ``notes``) sets it in wandb: a str, or None.

    Raises:
        ValueError: anything else (wandb's settings raise pydantic's ValidationError, a
            ValueError, at the assignment).
    """
    if value is None:
        return None
    text = _as_str(value)
    if text is None:
        raise ValueError(
            f"wandb_funnel: run.{attr} must be a str or None, got "
            f"{type(value).__name__} {reprlib.repr(value)}"
        )
    return text


def run_tags(value: Any) -> tuple[tuple[str, ...] | None, str]:
    """``value`` as ``run.tags = value`` sets it in wandb: ``(tags, "")``; or ``(None, why)``
    where wandb warns ``Invalid tag detected: {why} Tags not updated.`` and keeps the tags
    the run had (each tag a str of 1 to 64 characters). A str is a sequence of tags of one
    character each, as ``tuple("abc")`` is in wandb.

    Raises:
        TypeError: ``value`` is not iterable (wandb's ``tuple(tags)`` raises it).
    """
    tags = tuple(value)
    errors: list[str] = []
    for i, tag in enumerate(tags):  # wandb's validator: the length of str(tag), first
        text = str(tag)
        if not text:
            errors.append(f"Tag at index {i} is empty. {_TAG_LENGTH}")
        elif len(text) > 64:
            shown = f"{text[:20]}...{text[-20:]}" if len(text) > 43 else text
            errors.append(f"Tag '{shown}' is {len(text)} characters. {_TAG_LENGTH}")
    if not errors:  # then the type: a tuple of str
        out = [_as_str(tag) for tag in tags]
        errors = [
            f"Tag at index {i} is not a str: {reprlib.repr(tag)}"
            for i, (tag, text) in enumerate(zip(tags, out, strict=True))
            if text is None
        ]
        if not errors:
            return tuple(t for t in out if t is not None), ""
    return None, "; ".join(errors)
