"""free_port() hands out a port nobody else is handed meanwhile, and a server binds it."""

from __future__ import annotations

import socket

from danube.up import free_port


def test_ports_are_not_handed_out_twice_while_their_servers_start() -> None:
    # 500 picks from ~14 000 ports: a port merely free a moment ago repeats with
    # probability 1 - exp(-500²/28 000) ≈ 0.9999.
    picked = [free_port() for _ in range(500)]
    assert len(set(picked)) == len(picked)
    others = set()
    for _ in range(500):  # nor does anybody else's bind(0) get one of them
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            others.add(sock.getsockname()[1])
    assert not others & set(picked)


def test_a_server_with_reuseaddr_binds_the_port_at_once() -> None:
    port = free_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = server.accept()
            with accepted:
                client.sendall(b"ping")
                assert accepted.recv(4) == b"ping"
