"""``Run.log`` without a logger: what it refuses, it refuses before connecting."""

from __future__ import annotations

import pytest

from wandb_funnel._worker.run import AttachInfo, Run


def test_bad_data_on_first_use_raises_before_the_rank_connects() -> None:
    # Nothing listens here: a stream made anyway would be a rank holding rows back for good.
    info = AttachInfo("ipc:///nonexistent/wandb-funnel.sock", "token", "run", 1 << 20)
    run = Run(info, requested_rank=None)
    with pytest.raises(TypeError, match="keys must be str"):
        run.log({1: 2.0})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="must be a dict"):
        run.log([("loss", 1.0)])  # type: ignore[arg-type]
    assert run._stream is None
