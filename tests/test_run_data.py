"""``run.config`` and ``run.summary`` behave like wandb 0.31's, and send each change once."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from wandb_funnel._worker.run_data import (
    Config,
    ConfigError,
    Summary,
    jsonable,
    run_tags,
    run_text,
)


def _config() -> tuple[Config, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    return Config(sent.append), sent


def test_config_takes_attribute_and_item_access_and_sends_changes() -> None:
    config, sent = _config()
    config.update({"lr": 0.1, "--batch": 8})  # keys lose their dashes, as in wandb
    config["layers"] = 2
    config.dropout = 0.5  # type: ignore[attr-defined]  # wandb's config takes attributes
    assert config.lr == config["lr"] == 0.1
    assert config["batch"] == 8 and config.get("missing", 7) == 7
    assert "layers" in config and sorted(config) == ["batch", "dropout", "layers", "lr"]
    assert sent == [{"lr": 0.1, "batch": 8}, {"layers": 2}, {"dropout": 0.5}]
    with pytest.raises(AttributeError, match="no key 'nope'"):
        _ = config.nope


def test_changing_a_value_needs_allow_val_change_as_in_wandb() -> None:
    config, sent = _config()
    config.update({"lr": 0.1})
    config.update({"lr": 0.1})  # the same value: fine, and nothing is sent again
    assert sent == [{"lr": 0.1}]
    with pytest.raises(ConfigError, match='change value of key "lr"'):
        config.update({"lr": 0.2})
    with pytest.raises(ConfigError):
        config["lr"] = 0.3
    config.update({"lr": 0.2}, allow_val_change=True)
    assert config.lr == 0.2 and sent[-1] == {"lr": 0.2}


def test_setdefaults_sets_only_missing_keys() -> None:
    config, sent = _config()
    config.update({"a": 1})
    config.setdefaults({"a": 2, "b": 3})
    assert config.as_dict() == {"a": 1, "b": 3} and sent[-1] == {"b": 3}


def test_values_are_stored_as_wandb_stores_them() -> None:
    config, _ = _config()
    config.update(argparse.Namespace(id2label={0: "neg", 1: "pos"}, shape=(2, 3), fn=print))
    assert config.id2label == {"0": "neg", "1": "pos"}  # JSON: int keys become str
    assert config.shape == [2, 3] and config.fn == str(print)
    assert jsonable({"nested": {1.5: None}}) == {"nested": {"1.5": None}}
    with pytest.raises(TypeError, match="config keys must be str"):
        config.update({1: "x"})
    with pytest.raises(TypeError, match="config must be a dict"):
        config.update(3)


def test_a_value_the_wire_cannot_carry_is_refused_at_the_call_with_value_error() -> None:
    """A config that contains itself, or nests deeper than the wire's limit, is refused at
    ``config.update`` (it reached the logger once, and wandb refused it there, far from the
    call), and the message does not recurse into the value."""
    config, sent = _config()
    looped: dict[str, Any] = {}
    looped["me"] = looped
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(980):
        cur["d"] = {}
        cur = cur["d"]
    for bad in (looped, deep):
        with pytest.raises(ValueError, match="config value"):
            config.update({"bad": bad})
    assert sent == [] and "bad" not in config


def test_an_error_class_of_the_callers_choice() -> None:
    class WandbConfigError(Exception):
        pass

    config = Config(lambda data: None, error=WandbConfigError)
    config.update({"a": 1})
    with pytest.raises(WandbConfigError):
        config.update({"a": 2})


def test_summary_takes_items_attributes_and_updates() -> None:
    sent: list[dict[str, Any]] = []
    summary = Summary(sent.append)
    summary["best"] = 0.9
    summary.update({"epochs": 3}, final=True)
    summary.loss = 0.1
    assert summary["best"] == 0.9 and summary.epochs == 3 and summary.get("final") is True
    assert dict(summary.items()) == {"best": 0.9, "epochs": 3, "final": True, "loss": 0.1}
    assert sent == [{"best": 0.9}, {"epochs": 3, "final": True}, {"loss": 0.1}]
    with pytest.raises(TypeError, match="keys must be str"):
        summary.update({1: 2})
    assert len(summary) == 4


# run.name / notes / tags: what wandb 0.31 takes (its Settings, validated on assignment, as
# its Run's setters use them) and what it refuses, mirrored without wandb.
_TEXTS: list[Any] = ["x", "", "multi\nline", b"bytes", None, 5, 3.0, ["x"], b"\xff"]
_TAGS: list[Any] = [
    ["a", "b"],
    ("t",),
    "abc",  # a str is a sequence of one-character tags, in wandb too
    [],
    [""],
    ["x" * 64],
    ["x" * 65],
    ["y" * 30],
    ["ok", 1],
    [b"raw"],
    [1, ""],
    {"k": 1},
    5,
    None,
]


def _wandbs(attr: str, value: Any) -> tuple[str, Any]:
    """What wandb's setter does with ``value``: ("ok", what it stores), ("warn", message),
    or ("raise", the exception's class, ValueError for pydantic's)."""
    import wandb

    settings = wandb.Settings()
    try:
        if attr == "tags":
            tags = tuple(value)
            try:
                settings.run_tags = tags
            except ValueError as exc:  # the setter's own extraction of the message
                message = str(exc)
                if "Value error," in message:
                    message = message.split("Value error, ")[1].split(" [type=")[0]
                return "warn", message
            return "ok", settings.run_tags
        setattr(settings, f"run_{attr}", value)
        return "ok", getattr(settings, f"run_{attr}")
    except ValueError:
        return "raise", ValueError
    except TypeError:
        return "raise", TypeError


def _ours(attr: str, value: Any) -> tuple[str, Any]:
    try:
        if attr == "tags":
            tags, why = run_tags(value)
            return ("ok", tags) if tags is not None else ("warn", why)
        return "ok", run_text(attr, value)
    except ValueError:
        return "raise", ValueError
    except TypeError:
        return "raise", TypeError


@pytest.mark.parametrize("value", _TEXTS, ids=repr)
def test_name_and_notes_take_what_wandbs_settings_take(value: Any) -> None:
    for attr in ("name", "notes"):
        assert _ours(attr, value) == _wandbs(attr, value)


@pytest.mark.parametrize("value", _TAGS, ids=repr)
def test_tags_take_refuse_and_warn_as_wandbs_setter_does(value: Any) -> None:
    ours, wandbs = _ours("tags", value), _wandbs("tags", value)
    if wandbs[0] == "warn" and "validation error" in wandbs[1]:
        # a tag that is not a str: wandb's message is pydantic's report; ours names the tag
        assert ours[0] == "warn" and "is not a str" in ours[1]
    else:
        assert ours == wandbs
