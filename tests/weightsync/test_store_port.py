"""The weight-sync group's store port is drawn as the learner rendezvous draws its own: outside Ray's
worker ports and the kernel's ephemeral range, so nothing takes it before rank 0 binds it."""

from __future__ import annotations

import socket

import pytest

from deploy import weight_sync
from deploy.topology import TCP_PORTS, free_tcp_port


def test_the_cross_node_store_port_comes_from_the_rendezvous_range(monkeypatch):
    import ray

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    ports = set()
    for _ in range(20):
        host, port, store_file = weight_sync._rendezvous(multi_node=True)
        assert (host, store_file) == ("127.0.0.1", None)
        assert TCP_PORTS[0] <= port < TCP_PORTS[1]
        ports.add(port)
        with socket.socket() as sock:
            sock.bind((host, port))  # free when drawn
    assert len(ports) > 1  # drawn at random, not one fixed port


def test_one_node_uses_a_store_file_and_no_port():
    host, port, store_file = weight_sync._rendezvous(multi_node=False)
    assert host == "127.0.0.1" and port == 0 and store_file is not None


def test_a_full_range_names_what_the_port_was_for(monkeypatch):
    import random

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(random, "randrange", lambda *_: taken.getsockname()[1])  # every draw is taken
        with pytest.raises(RuntimeError, match="for the weight-sync store"):
            free_tcp_port("127.0.0.1", purpose="the weight-sync store")
