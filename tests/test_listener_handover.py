"""The gateway socket's keeper across a restart (letsinfer/service/listener.py),
on its own: a client that connects while no node runs waits in the backlog and
is accepted by the next start; a deep home (a unix socket's address is at most
107 bytes) works the same."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from letsinfer.connections import listening_socket
from letsinfer.home import Home
from letsinfer.service import listener
from tests.nodes import free_port


@pytest.mark.parametrize("depth", [1, 12])
def test_a_kept_socket_carries_its_waiting_client_to_the_next_start(
    tmp_path: Path, depth: int
) -> None:
    root = tmp_path.joinpath(*(["deep-folder"] * depth))
    home = Home.under(root)
    home.run.mkdir(parents=True)
    assert depth == 1 or len(str(listener.keeper_path(home))) > 107
    port = free_port()
    old = listening_socket("127.0.0.1", port)
    assert listener.hand_over(home, old)
    old.close()  # the old process is gone: only the keeper holds the port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"hello")  # queued in the backlog: not refused
        new = listener.take(home, "127.0.0.1", port)
        assert new is not None, "the next start takes the socket"
        try:
            new.settimeout(5)
            conn, _ = new.accept()
            with conn:
                assert conn.recv(5) == b"hello"
        finally:
            new.close()
    assert not listener.keeper_path(home).exists()
    assert listener.take(home, "127.0.0.1", port) is None  # used up


def test_a_kept_socket_for_another_address_is_not_taken(tmp_path: Path) -> None:
    home = Home.under(tmp_path)
    home.run.mkdir(parents=True)
    port = free_port()
    old = listening_socket("127.0.0.1", port)
    assert listener.hand_over(home, old)
    old.close()
    assert listener.take(home, "127.0.0.1", free_port()) is None  # settings changed: bind afresh
    # The port closes once the keeper, which gave it away, has exited.
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                break
        assert time.monotonic() < deadline, "the port stays open"
        time.sleep(0.05)
