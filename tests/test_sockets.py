"""_protocol.sockets: the private IPC endpoint, the two socket kinds, CURVE keys, and errors
that keep pyzmq's own type. In-process, real ZeroMQ."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import pytest
import zmq

from wandb_funnel._protocol.sockets import (
    CLOSER_PREFIX,
    STREAM_PREFIX,
    ClientSocket,
    LoggerSocket,
    client_curve,
    new_curve_keys,
    private_ipc_endpoint,
    remove_ipc_dir,
)


@pytest.fixture
def endpoint() -> Iterator[tuple[str, str]]:
    address, directory = private_ipc_endpoint()
    yield address, directory
    remove_ipc_dir(directory)


def test_the_ipc_directory_is_private_and_removed(endpoint: tuple[str, str]) -> None:
    address, directory = endpoint
    assert address.startswith("ipc://") and address[len("ipc://") :].startswith(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    remove_ipc_dir(directory)
    assert not os.path.exists(directory)
    remove_ipc_dir(directory)  # twice, and None: never raises
    remove_ipc_dir(None)


def test_a_frame_goes_both_ways_with_the_sender_identity(endpoint: tuple[str, str]) -> None:
    address, _ = endpoint
    server = LoggerSocket(address, 10, 1 << 20)
    client = ClientSocket(address, STREAM_PREFIX + b"a" * 11, 10)
    try:
        assert client.send_within(b"hello", 2.0)
        assert server.wait(2.0)
        message = server.recv_nowait()
        assert message is not None
        identity, frames = message
        assert identity == STREAM_PREFIX + b"a" * 11 and frames == [b"hello"]
        assert server.recv_nowait() is None
        server.reply(identity, b"welcome")
        assert client.recv_within(2.0) == b"welcome"
        assert client.recv_within(0.05) is None
    finally:
        client.close(0)
        client.close(0)  # idempotent
        server.close()


def test_identity_prefixes_are_distinct_and_never_zeromqs_own() -> None:
    assert STREAM_PREFIX != CLOSER_PREFIX  # type: ignore[comparison-overlap]
    assert STREAM_PREFIX[0] != 0 and CLOSER_PREFIX[0] != 0  # a zero byte is ZeroMQ's


def test_a_bad_endpoint_is_pyzmqs_error_with_the_address() -> None:
    with pytest.raises(zmq.ZMQError, match="bogus://nowhere") as caught:
        ClientSocket("bogus://nowhere", STREAM_PREFIX + b"x" * 11, 10)
    assert caught.value.errno == zmq.EPROTONOSUPPORT


def test_curve_keys_give_clients_everything_but_the_server_secret() -> None:
    keys = new_curve_keys()
    client = client_curve(keys)
    assert set(client) == {"server_public", "client_public", "client_secret"}
    assert keys["server_secret"] not in client.values()
    assert new_curve_keys() != keys  # fresh per funnel


def test_curve_over_tcp_lets_the_job_in_and_refuses_a_stranger() -> None:
    keys = new_curve_keys()
    _, directory = private_ipc_endpoint()
    server = LoggerSocket(f"ipc://{directory}/s", 10, 1 << 20, "127.0.0.1", keys)
    assert server.tcp_endpoint is not None and server.tcp_endpoint.startswith("tcp://127.0.0.1:")
    public, secret = zmq.curve_keypair()
    stranger_keys = {
        **client_curve(keys),
        "client_public": public.decode(),
        "client_secret": secret.decode(),
    }
    member = ClientSocket(server.tcp_endpoint, STREAM_PREFIX + b"m" * 11, 10, client_curve(keys))
    stranger = ClientSocket(server.tcp_endpoint, STREAM_PREFIX + b"s" * 11, 10, stranger_keys)
    try:
        assert member.send_within(b"from the job", 5.0)
        stranger.try_send(b"from elsewhere")
        got = []
        while server.wait(1.5):
            message = server.recv_nowait()
            if message is not None:
                got.append(message[1][0])
        assert got == [b"from the job"]
        assert server.handshake_failures() >= 1
    finally:
        member.close(0)
        stranger.close(0)
        server.close()
        remove_ipc_dir(directory)
