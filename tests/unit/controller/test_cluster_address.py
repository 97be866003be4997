"""Which Ray cluster `start_local_ray` joins: the one Ray's "auto" finds (RAY_ADDRESS, else the one last
started here), probed first so that a cluster recorded by a head that was killed (a scheduler's
teardown) cannot hang the join."""

import logging
import socket

import pytest

from megarl.controller.resource_pool import ResourcePoolError, _running_cluster_address

pytestmark = pytest.mark.unit


@pytest.fixture
def ray_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # "auto" also joins the one raylet running on the machine (another test's cluster): none here
    monkeypatch.setattr("ray._private.services.find_gcs_addresses", lambda: frozenset())
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


def test_nothing_recorded_means_start_a_local_cluster(ray_tmp):
    assert _running_cluster_address() is None


def test_the_recorded_cluster_is_joined_when_it_answers(ray_tmp, listening):
    (ray_tmp / "ray_current_cluster").write_text(listening)
    assert _running_cluster_address() == listening


def test_a_recorded_cluster_that_is_gone_is_ignored_with_a_warning(ray_tmp, caplog):
    gone = closed_port()
    (ray_tmp / "ray_current_cluster").write_text(gone)
    with caplog.at_level(logging.WARNING):
        assert _running_cluster_address(probe_timeout_s=1) is None
    assert gone in caplog.text and "gone" in caplog.text


def test_ray_address_wins_over_the_record(ray_tmp, listening, monkeypatch):
    (ray_tmp / "ray_current_cluster").write_text(closed_port())
    monkeypatch.setenv("RAY_ADDRESS", listening)
    assert _running_cluster_address() == listening


def test_an_unreachable_ray_address_is_an_error_naming_it(ray_tmp, monkeypatch):
    gone = closed_port()
    monkeypatch.setenv("RAY_ADDRESS", gone)
    with pytest.raises(ResourcePoolError, match=f"RAY_ADDRESS={gone} does not answer.*unset RAY_ADDRESS"):
        _running_cluster_address(probe_timeout_s=1)


@pytest.mark.parametrize("address", ["10.0.0.1", "[::1]"])
def test_a_ray_address_without_a_port_is_an_error_saying_so(ray_tmp, monkeypatch, address):
    monkeypatch.setenv("RAY_ADDRESS", address)
    with pytest.raises(ResourcePoolError, match="is not host:port"):
        _running_cluster_address()


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
        assert _running_cluster_address() == address


def test_a_stale_record_does_not_stop_a_local_cluster_from_starting(ray_tmp, monkeypatch):
    """The fallback asks for a new cluster: ray.init would otherwise try to join the record."""
    import ray

    from megarl.controller import resource_pool

    (ray_tmp / "ray_current_cluster").write_text(closed_port())
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    resource_pool.start_local_ray(num_cpus=3)
    assert calls and calls[0]["address"] == "local" and calls[0]["num_cpus"] == 3
