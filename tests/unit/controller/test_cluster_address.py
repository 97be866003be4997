"""Which Ray cluster `start_local_ray` joins: RAY_ADDRESS, else the one last started here, probed first
so that a cluster recorded by a head that was killed (a scheduler's teardown) cannot hang the join."""

import logging
import socket

import pytest

from megarl.controller.resource_pool import ResourcePoolError, _running_cluster_address

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
