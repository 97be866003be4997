"""Device names: the forms a config accepts, and the cluster they come from."""

import pytest

from megarl.config.devices import Device, cluster_devices, describe_cluster, parse_device, show_devices

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text, device",
    [
        ("cuda:0", Device(node=0, index=0, kind="cuda")),
        ("cuda:7", Device(node=0, index=7, kind="cuda")),
        ("node:1/cuda:3", Device(node=1, index=3, kind="cuda")),
        ("cpu:1", Device(node=0, index=1, kind="cpu")),
        (" node:2/cpu:0 ", Device(node=2, index=0, kind="cpu")),
    ],
)
def test_each_accepted_form_parses_and_prints_back(text, device):
    assert parse_device(text) == device
    assert parse_device(str(device)) == device
    assert str(device) == text.strip().removeprefix("node:0/")


@pytest.mark.parametrize(
    "text", ["gpu:0", "cuda", "cuda:-1", "0", "node:1:cuda:0", "cuda:0/node:1", "CPU:0", ""]
)
def test_a_bad_name_names_itself_and_the_accepted_forms(text):
    with pytest.raises(ValueError) as info:
        parse_device(text)
    assert str(info.value) == f"{text!r} is not a device; write cuda:N, node:K/cuda:N or cpu:N (N, K ≥ 0)"


def test_the_cluster_is_node_major_and_described_in_a_few_words():
    assert [str(d) for d in cluster_devices(2, 2, "cpu")] == [
        "cpu:0",
        "cpu:1",
        "node:1/cpu:0",
        "node:1/cpu:1",
    ]
    assert sorted([parse_device("node:1/cuda:0"), parse_device("cuda:1")]) == [Device(0, 1), Device(1, 0)]
    assert show_devices(cluster_devices(1, 2, "cpu")) == "[cpu:0, cpu:1]"
    assert describe_cluster(1, 2, "cpu") == "cpu:0..cpu:1"
    assert describe_cluster(1, 1, "cuda") == "cuda:0"
    assert describe_cluster(2, 8, "cuda") == "node:0..node:1 × cuda:0..cuda:7"
