"""The wandb sink without a run: run ids made without wandb, settings as plain data."""

from __future__ import annotations

import json

import pytest
import wandb

from wandb_funnel.sinks import generate_run_id
from wandb_funnel.sinks.wandb.settings import settings_to_dict


def test_run_ids_look_like_wandbs() -> None:
    ids = {generate_run_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 8 and i.isalnum() and i.lower() == i for i in ids)


def test_settings_travel_as_the_fields_the_user_set() -> None:
    assert settings_to_dict(None) == {}
    assert settings_to_dict({"console": "off"}) == {"console": "off"}
    as_dict = settings_to_dict(wandb.Settings(console="off", x_stats_sampling_interval=5.0))
    assert as_dict["console"] == "off" and as_dict["x_stats_sampling_interval"] == 5.0
    json.dumps(as_dict)  # plain data: it reaches the logger process as JSON
    with pytest.raises(TypeError, match=r"settings must be a wandb\.Settings or a dict"):
        settings_to_dict(["console", "off"])
