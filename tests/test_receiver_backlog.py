"""The logger's receiver with a writer that takes nothing (wandb stalled): real ZeroMQ sockets
and the real client stream, in one process, no wandb.

Found by CI (soak scenario sink-stalls): a receiver that stopped reading when its queue was
full left a worker's last batches and its GOODBYE behind full ZeroMQ queues; the worker's exit
timeout ran out and those records were missing from the run with no count in its summary.
"""

from __future__ import annotations

import os
import queue
import warnings

import pytest

from wandb_funnel._constants import BATCH_RECORDS
from wandb_funnel._logger.events import Attached, Ended, Records
from wandb_funnel._logger.receiver import Receiver
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import RecordBatch
from wandb_funnel._protocol.sockets import LoggerSocket, private_ipc_endpoint, remove_ipc_dir
from wandb_funnel._worker.stream import Stream
from wandb_funnel.errors import FunnelWarning

pytestmark = pytest.mark.timeout(60)

TOKEN = "t" * 32
QUEUE_BOUND = 1_000  # records the receiver may hand to the (stalled) writer


def _events(receiver: Receiver) -> list[object]:
    out: list[object] = []
    while True:
        try:
            out.extend(receiver.events.get(0.0))  # a list: what one drain took
        except queue.Empty:
            return out


@pytest.mark.parametrize("records", [500, 5_000, 200_000])
def test_a_stalled_writer_still_gets_every_goodbye_and_counts_every_drop(
    records: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded_batches = 0
    real_decode = codec.decode

    def counting_decode(frame: bytes, max_frame_bytes: int) -> object:
        nonlocal decoded_batches
        message = real_decode(frame, max_frame_bytes)
        decoded_batches += isinstance(message, RecordBatch)
        return message

    monkeypatch.setattr(codec, "decode", counting_decode)
    endpoint, directory = private_ipc_endpoint()
    sock = LoggerSocket(endpoint, 1_000, 1 << 20)
    receiver = Receiver(sock, TOKEN, 1 << 20, QUEUE_BOUND)
    receiver.start()
    stream = Stream(endpoint, TOKEN, requested_rank=1, logger_pid=os.getpid())
    try:
        packed = codec.encode_record(0, False, {"x": 1.0}, 1 << 16)
        for _ in range(records):
            stream.push(packed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # Longer than a test needs: a loaded CI machine must not make a receipt look lost.
            stream.close("done", timeout=20.0)
        messages = [str(w.message) for w in caught if issubclass(w.category, FunnelWarning)]
        assert not any("did not confirm receipt" in m for m in messages), messages
        receiver.stop(timeout=5.0)
        assert not receiver.is_alive()
        events = _events(receiver)
        assert isinstance(events[0], Attached)
        ended = [e for e in events if isinstance(e, Ended)]
        assert ended == [Ended(1, gone=False, exit_code=0)]
        # (A dropped batch is still an event, with no records: its numbers are done with.)
        handed = [e for e in events if isinstance(e, Records) and e.records]
        queued = sum(len(e.records) for e in handed)
        # Every record is either handed to the writer or counted, by the receiver or the worker.
        assert queued + receiver.dropped == records
        # The queue fills to within a batch of its bound, never past it.
        assert (
            queued == records
            if records <= QUEUE_BOUND
            else QUEUE_BOUND - BATCH_RECORDS < queued <= QUEUE_BOUND
        )
        # A batch that does not fit is counted from its header: none is decoded to be dropped.
        assert decoded_batches == len(handed)
        if records > QUEUE_BOUND:
            assert any(f"of {records} records did not reach the run" in m for m in messages)
        else:
            assert messages == []
    finally:
        stream.close("cleanup", timeout=0.0)
        receiver.stop(timeout=5.0)
        sock.close()
        remove_ipc_dir(directory)
