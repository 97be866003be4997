"""The rendezvous store (torch's TCPStore) served on the master address only.

torch binds a TCPStore server to every interface (it takes no bind address), so megarl binds and listens
on the master address itself — 127.0.0.1 on one node, the first node's address across nodes — and hands
torch that socket (`master_listen_fd`). Its users: `init_distributed` (rank 0 of a Ray worker group or of
srun) and `python -m megarl.distributed.store` (torchrun, whose ranks use the store of torchrun's first
node: every launch of torchrun in megarl goes through it).
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import socket
import sys
from typing import Any

import torch.distributed as dist

from megarl.errors import MegarlError


class StoreAddressError(MegarlError, RuntimeError):
    """The rendezvous store cannot listen on its address (MASTER_ADDR:MASTER_PORT)."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `port` at `host`'s address, not on every interface — unless `host` is a
    name that resolves to loopback here only (a hostname /etc/hosts maps to 127.0.1.1, which names this
    node for the others): then on every interface, as torch listens."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        raise StoreAddressError(
            f"the rendezvous address MASTER_ADDR={host} cannot be resolved ({e.strerror or e}); set it to "
            "an address of the first rank's node"
        ) from e
    if ipaddress.ip_address(address[0]).is_loopback and not _names_loopback(host):
        address = ("::" if family == socket.AF_INET6 else "0.0.0.0", port)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        fix = (
            "another process listens on that port; set MASTER_PORT to a free one"
            if e.errno == errno.EADDRINUSE
            else "MASTER_ADDR must be an address of the first rank's node"
        )
        raise StoreAddressError(
            f"the rendezvous store cannot listen on {host}:{port} ({e.strerror or e}); {fix}"
        ) from e
    return sock


def _names_loopback(host: str) -> bool:
    """`host` is a loopback address or `localhost` (for every process, not only this machine's)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tcp_store(
    host_name: str,
    port: int,
    world_size: int | None = None,
    is_master: bool = False,
    timeout: datetime.timedelta = datetime.timedelta(seconds=300),
    **kwargs: Any,
) -> dist.TCPStore:
    """torch's TCPStore at host_name:port (its arguments); the master serves it on host_name only."""
    if is_master:
        kwargs["master_listen_fd"] = listening_socket(host_name, port).detach()  # the store closes it
    return dist.TCPStore(host_name, port, world_size, is_master, timeout, **kwargs)


def torchrun_main() -> None:
    """torchrun (`torch.distributed.run`, same arguments) whose store listens on --master_addr only."""
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    static_tcp_rendezvous.TCPStore = tcp_store  # the store of --master_addr/--master_port (static)
    run.main()


if __name__ == "__main__":
    sys.argv[0] = "torchrun"
    torchrun_main()
