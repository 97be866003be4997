"""`launch/ray/submit.sh` against a running Ray cluster (a head started with `ray start`, its job server
on): two steps train as a Ray job; a bad config is refused before anything is submitted; a job that
fails on the cluster returns its failure; the cluster is stopped by PID, leaving nothing behind."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.launch import (
    CONFIG,
    REPO,
    assert_no_new_ray_processes,
    free_port,
    job_env,
    ray_processes,
    run_overrides,
    steps_written,
)

pytestmark = pytest.mark.ray

SUBMIT = REPO / "launch" / "ray" / "submit.sh"


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A one-node Ray cluster with token auth and the job server, in its own temp dir."""
    before = ray_processes()
    gcs, dashboard = free_port(), free_port()
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env = {**os.environ, **auth, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    temp = f"/tmp/megarl-ray-submit-{gcs}"  # short: Ray's socket paths must fit in 107 bytes
    log = open(tmp_path_factory.mktemp("ray_head") / "ray_start.log", "w")
    cmd = [
        sys.executable,
        "-c",
        "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()",
    ]
    head = subprocess.Popen(
        [*cmd, "start", "--head", "--block", "--port", str(gcs), "--dashboard-port", str(dashboard),
         "--include-dashboard", "true", "--temp-dir", temp, "--num-cpus", "8", "--disable-usage-stats",
         # not Ray's fixed 52365 / 10001: another cluster on this machine (the session's) holds them
         "--dashboard-agent-listen-port", str(free_port()), "--ray-client-server-port", str(free_port())],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    server = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{server}/api/version", timeout=2)
                break
            except urllib.error.HTTPError:  # it answers (401 without the token): it is up
                break
            except OSError:
                assert head.poll() is None and time.monotonic() < deadline, "the Ray head did not come up"
                time.sleep(1)
        yield {**auth, "RAY_API_SERVER_ADDRESS": server}
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops its own daemons
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        log.close()
        assert_no_new_ray_processes(before)


def submit(ray_head: dict, args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, **job_env(MEGARL_JOB_PYTHON=sys.executable), **ray_head}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        ["bash", str(SUBMIT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=400
    )


def test_a_submitted_job_trains_two_steps_into_the_submitters_output_dir(ray_head, tiny_run, tmp_path):
    overrides = run_overrides(tiny_run, Path("run"))  # relative: to where it is submitted from
    done = submit(ray_head, [str(CONFIG), *overrides], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "succeeded" in (done.stdout + done.stderr).lower()
    assert steps_written(tmp_path / "run") == [1, 2]


def test_a_bad_config_is_refused_before_submitting(ray_head, tiny_run, tmp_path):
    done = submit(
        ray_head, [str(CONFIG), *run_overrides(tiny_run, tmp_path / "run", "rollout.n=0")], tmp_path
    )
    assert done.returncode != 0
    assert "rollout.n=0" in done.stderr and "raysubmit" not in done.stdout + done.stderr


def test_a_job_that_fails_on_the_cluster_returns_its_failure(ray_head, tiny_run, tmp_path):
    missing = tmp_path / "no_such_model"
    overrides = run_overrides(tiny_run, tmp_path / "run", f"model.path={missing}")
    done = submit(ray_head, [str(CONFIG), *overrides], tmp_path)
    assert done.returncode != 0
    assert "failed" in done.stdout + done.stderr and str(missing) in done.stdout + done.stderr
