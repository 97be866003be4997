"""Which Ray cluster `start_local_ray` joins: only the one RAY_ADDRESS names (probed first, so that a
cluster that is gone fails at once instead of hanging the join); without it, a private cluster — never
one that merely runs on the machine (another run's: it would end this one when it ends)."""

import socket

import pytest

from megarl.controller import resource_pool
from megarl.controller.resource_pool import ResourcePoolError, named_cluster_address

pytestmark = pytest.mark.unit


@pytest.fixture
def ray_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray"


@pytest.fixture
def listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def ray_init_calls(monkeypatch):
    import ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(resource_pool, "_bind_loopback", lambda: None)
    return calls


def test_a_cluster_running_here_is_not_joined_unless_named(ray_tmp, listening, ray_init_calls):
    """The cluster last started on this machine (Ray's record) answers, but nobody named it: a private
    cluster starts, bound to loopback, without the dashboard and the metrics exporter."""
    (ray_tmp / "ray_current_cluster").write_text(listening)
    assert named_cluster_address() is None
    resource_pool.start_local_ray(num_cpus=3)
    (call,) = ray_init_calls
    assert call["address"] == "local" and call["num_cpus"] == 3
    assert call["_node_ip_address"] == "127.0.0.1" and call["include_dashboard"] is False
    assert call["_system_config"] == {"enable_metrics_collection": False}


def test_the_named_cluster_is_joined(ray_tmp, listening, monkeypatch, ray_init_calls):
    monkeypatch.setenv("RAY_ADDRESS", listening)
    assert named_cluster_address() == listening
    resource_pool.start_local_ray()
    assert [c["address"] for c in ray_init_calls] == ["auto"]  # Ray resolves it to RAY_ADDRESS


def test_an_unreachable_ray_address_is_an_error_naming_it(ray_tmp, monkeypatch):
    gone = closed_port()
    monkeypatch.setenv("RAY_ADDRESS", gone)
    with pytest.raises(ResourcePoolError, match=f"RAY_ADDRESS={gone} does not answer.*unset RAY_ADDRESS"):
        named_cluster_address(probe_timeout_s=1)


def test_ray_address_auto_with_no_cluster_here_says_what_to_do(ray_tmp, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    monkeypatch.setattr("ray._private.services.find_gcs_addresses", lambda: frozenset())
    with pytest.raises(ResourcePoolError, match="RAY_ADDRESS=auto: no Ray cluster runs on this machine"):
        named_cluster_address()


@pytest.mark.parametrize("address", ["10.0.0.1", "[::1]"])
def test_a_ray_address_without_a_port_is_an_error_saying_so(ray_tmp, monkeypatch, address):
    monkeypatch.setenv("RAY_ADDRESS", address)
    with pytest.raises(ResourcePoolError, match="is not host:port"):
        named_cluster_address()


def test_an_ipv6_ray_address_that_answers_is_joined(ray_tmp, monkeypatch):
    try:
        server = socket.socket(socket.AF_INET6)
        server.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with server:
        server.listen()
        address = f"[::1]:{server.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)
        assert named_cluster_address() == address


def test_ray_init_does_not_take_this_processs_sigterm_handler(ray_tmp, monkeypatch):
    """ray.init installs its own SIGTERM handler (sys.exit); megarl's stop-signal handler stays."""
    import signal

    import ray

    def ray_init(**kwargs):
        signal.signal(signal.SIGTERM, lambda *a: None)

    def mine(signum, frame):
        pass

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", ray_init)
    monkeypatch.setattr(resource_pool, "_bind_loopback", lambda: None)
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        resource_pool.start_local_ray()
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
