"""The rendezvous store listens on its address alone, and says what is wrong when it cannot."""

from __future__ import annotations

import datetime
import socket

import psutil
import pytest

from megarl.distributed.store import StoreAddressError, listening_socket, tcp_store

TIMEOUT = datetime.timedelta(seconds=10)


def _listening(port: int) -> list[str]:
    return [
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]


def test_the_master_serves_the_store_on_its_address_only_and_a_client_reaches_it():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    master = tcp_store("127.0.0.1", port, 2, True, TIMEOUT, wait_for_workers=False)
    assert _listening(port) == ["127.0.0.1"]  # torch's own server would listen on 0.0.0.0 / ::
    client = tcp_store("127.0.0.1", port, 2, False, TIMEOUT)
    client.set("key", "value")
    assert master.get("key") == b"value"
    del client, master
    assert _listening(port) == []  # the store closed the socket it was handed


def test_a_taken_port_and_an_address_of_no_local_interface_are_named_with_their_fix():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StoreAddressError) as err:
            tcp_store("127.0.0.1", port, 2, True, TIMEOUT)
    assert str(err.value) == (
        f"the rendezvous store cannot listen on 127.0.0.1:{port} (Address already in use); another "
        "process listens on that port; set MASTER_PORT to a free one"
    )
    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    elsewhere = next(
        ip for ip in ("203.0.113.7", "198.51.100.7", "192.0.2.7") if ip not in local
    )  # TEST-NETs
    with pytest.raises(StoreAddressError) as err:
        tcp_store(elsewhere, port, 2, True, TIMEOUT)
    assert str(err.value) == (
        f"the rendezvous store cannot listen on {elsewhere}:{port} (Cannot assign requested address); "
        "MASTER_ADDR must be an address of the first rank's node"
    )


def test_a_name_that_resolves_to_loopback_here_only_serves_on_every_interface(monkeypatch):
    """A hostname that /etc/hosts maps to 127.0.1.1 names this node for the other nodes: listening on
    127.0.1.1 alone would shut them out, so the store listens as torch does (only literal loopback
    addresses and `localhost` keep it on loopback)."""
    real = socket.getaddrinfo

    def hosts_file(host, *args, **kwargs):  # what such an /etc/hosts answers for this node's name
        return real("127.0.1.1" if host == "node0" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hosts_file)
    for host, served_on in (("node0", "0.0.0.0"), ("localhost", "127.0.0.1"), ("127.0.0.1", "127.0.0.1")):
        sock = listening_socket(host, 0)
        try:
            assert sock.getsockname()[0] == served_on, host
        finally:
            sock.close()
