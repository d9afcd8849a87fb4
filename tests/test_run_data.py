"""``run.config`` and ``run.summary`` behave like wandb 0.31's, and send each change once."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from wandb_funnel._worker.run_data import Config, ConfigError, Summary, jsonable


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
