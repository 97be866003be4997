"""Placement: `<role>.devices` → pools (same devices: one pool, disjoint: a pool each), and every map that
cannot work rejected by load_config, before any process starts, with a message naming the key and a fix."""

from pathlib import Path

import pytest

from megarl.config import ConfigError, config_to_yaml, load_config
from megarl.config.placement import placement
from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig, ParallelConfig

pytestmark = pytest.mark.unit

# PPO with a critic (gae) on a 1 × 2 cluster of CPU process slots; no files are looked at
PPO = (
    "model.path=/models/policy",
    "algorithm.name=ppo",
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=8",
    "algorithm.ppo_mini_batch_size=8",
    "rollout.n=4",
    "trainer.n_devices_per_node=2",
)
KL = "algorithm.use_kl_loss=true"  # turns the reference on


def _load(*overrides: str, path: Path | None = None) -> MegarlConfig:
    return load_config(path, [*PPO, *overrides], check_paths=False)


def _pools(cfg: MegarlConfig) -> list[tuple[tuple[str, ...], list[str], tuple[int, ...]]]:
    return [(p.roles, [str(d) for d in p.devices], p.nodes) for p in placement(cfg).pools]


def test_without_devices_every_role_is_on_the_actors_pool_as_before():
    cfg = _load(KL)
    assert _pools(cfg) == [(("actor", "ref", "critic"), ["cuda:0", "cuda:1"], (2,))]
    assert placement(cfg).ref_in_actor_processes
    assert [cfg.world_size(r) for r in ("actor", "ref", "critic")] == [2, 2, 2]


def test_the_same_devices_share_one_pool_and_disjoint_devices_get_one_each():
    colocated = _load("actor.devices=[cpu:0]", "critic.devices=[cpu:0]")
    assert _pools(colocated) == [(("actor", "critic"), ["cpu:0"], (1,))]
    separate = _load("actor.devices=[cpu:0]", "critic.devices=[cpu:1]")
    assert _pools(separate) == [(("actor",), ["cpu:0"], (1,)), (("critic",), ["cpu:1"], (1,))]
    assert separate.world_size("critic") == 1 and role_spec(separate, "critic").n_devices == 1


def test_a_pool_counts_its_devices_per_node():
    cfg = _load(
        "trainer.nnodes=2",
        "actor.devices=[cpu:0, cpu:1, node:1/cpu:1, node:1/cpu:0]",
        "critic.devices=[node:1/cpu:0, cpu:1, cpu:0, node:1/cpu:1]",  # the same set, in another order
    )
    assert _pools(cfg) == [(("actor", "critic"), ["cpu:0", "cpu:1", "node:1/cpu:0", "node:1/cpu:1"], (2, 2))]


def test_the_reference_on_devices_of_its_own_is_its_own_group_with_its_own_layout():
    cfg = _load(
        KL, "trainer.n_devices_per_node=4", "actor.devices=[cpu:0,cpu:1]", "ref.devices=[cpu:2,cpu:3]"
    )
    assert _pools(cfg)[1] == (("ref",), ["cpu:2", "cpu:3"], (2,))
    assert not placement(cfg).ref_in_actor_processes
    assert cfg.ref.parallel is None and cfg.parallel_of("ref") == cfg.actor.parallel  # the actor's layout
    with_tp = _load(
        KL,
        "trainer.n_devices_per_node=4",
        "actor.devices=[cpu:0,cpu:1]",
        "ref.devices=[cpu:2,cpu:3]",
        "ref.parallel.tp=2",
    )
    spec = role_spec(with_tp, "ref")
    assert (spec.parallel, spec.n_devices) == (ParallelConfig(tp=2), 2)
    assert with_tp.layout("ref").describe() == "tp2xpp1xdp1"


def test_the_reference_on_the_actors_devices_stays_in_the_actors_processes():
    cfg = _load(
        KL, "actor.devices=[cpu:0, cpu:1]", "ref.devices=[cpu:1, cpu:0]", "critic.devices=[cpu:0, cpu:1]"
    )
    assert _pools(cfg) == [(("actor", "ref", "critic"), ["cpu:0", "cpu:1"], (2,))]
    assert placement(cfg).ref_in_actor_processes


def test_n_devices_pools_keep_their_shape_whole_nodes_first():
    sizes = ("data.train_batch_size=6", "algorithm.ppo_mini_batch_size=6")  # 24 sequences: 3 critic ranks
    cfg = _load("trainer.nnodes=2", "actor.n_devices=1", "critic.n_devices=3", *sizes)
    assert _pools(cfg) == [(("actor",), ["cuda:0"], (1,)), (("critic",), [], (2, 1))]
    assert cfg.world_size("critic") == 3


def test_torchrun_accepts_devices_that_are_the_whole_cluster():
    cfg = _load("trainer.launcher=torchrun", "actor.devices=[cpu:0, cpu:1]", "critic.devices=[cpu:1, cpu:0]")
    assert _pools(cfg) == [(("actor", "critic"), ["cpu:0", "cpu:1"], (2,))]


def test_a_yaml_file_places_the_reference_and_the_critic(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "actor: {devices: [cpu:0, cpu:1], parallel: {tp: 2}}\n"
        "ref: {devices: [cpu:2, cpu:3], parallel: {pp: 2}}\n"
        "critic: {devices: [cpu:2, cpu:3]}\n"
        "algorithm: {use_kl_loss: true}\n"
    )
    cfg = _load("trainer.n_devices_per_node=4", path=path)
    assert _pools(cfg) == [
        (("actor",), ["cpu:0", "cpu:1"], (2,)),
        (("ref", "critic"), ["cpu:2", "cpu:3"], (2,)),
    ]
    assert cfg.ref.parallel == ParallelConfig(pp=2) and cfg.critic.parallel == ParallelConfig()
    again = tmp_path / "again.yaml"
    again.write_text(config_to_yaml(cfg))
    assert load_config(again, check_paths=False) == cfg


def test_dotlist_forms_a_lone_device_and_one_size_of_a_null_ref_parallel():
    cfg = _load(KL, "actor.devices=cpu:0", "ref.devices=cpu:1", "ref.parallel.pp=1", "critic.devices=[cpu:0]")
    assert cfg.ref.devices == ["cpu:1"] and cfg.ref.parallel == ParallelConfig()
    back = _load(
        KL,
        "actor.devices=cpu:0",
        "ref.devices=cpu:1",
        "ref.parallel.pp=1",
        "ref.parallel=null",
        "critic.devices=cpu:0",
    )
    assert back.ref.parallel is None


# Each map that cannot work, and its whole message: what is wrong, with the role's key, and what would fit.
INVALID = [
    (
        ["actor.devices=[cpu:0]", "critic.devices=[gpu:1]"],
        "critic.devices=[gpu:1]: 'gpu:1' is not a device; write cuda:N, node:K/cuda:N or cpu:N (N, K ≥ 0)",
    ),
    (
        ["actor.devices=[cpu:0, cuda:1]"],
        "actor.devices=[cpu:0, cuda:1] mixes cpu and cuda devices; a role runs on one kind, e.g. [cpu:0, cpu:1]",
    ),
    (
        ["actor.devices=[cpu:0]", "critic.devices=[cuda:1]"],
        "critic.devices are cuda devices but actor.devices are cpu; the cluster has one kind: write every role's "
        "devices as cpu:N (or all as cuda:N)",
    ),
    (
        ["actor.devices=[cpu:0, cpu:2]"],
        "actor.devices=[cpu:0, cpu:2] names cpu:2, which the cluster lacks: trainer.nnodes=1 × "
        "trainer.n_devices_per_node=2 gives cpu:0..cpu:1; use devices from those or raise "
        "trainer.n_devices_per_node to 3",
    ),
    (
        ["actor.devices=[cpu:0]", "critic.devices=[node:1/cpu:0]"],
        "critic.devices=[node:1/cpu:0] names node:1/cpu:0, which the cluster lacks: trainer.nnodes=1 × "
        "trainer.n_devices_per_node=2 gives cpu:0..cpu:1; use devices from those or raise trainer.nnodes to 2",
    ),
    (
        ["critic.devices=[cpu:1]"],
        "critic.devices=[cpu:1] shares cpu:1 with the actor's devices ([cpu:0, cpu:1], the whole cluster "
        "(actor.devices unset)) but not all of them; roles share all their devices (colocated) or none (a pool "
        "each): use critic.devices=[cpu:0, cpu:1], or devices no other role uses (none is free: give the other "
        "roles fewer)",
    ),
    (
        ["trainer.n_devices_per_node=4", "actor.devices=[cpu:0, cpu:1]", "critic.devices=[cpu:1, cpu:2]"],
        "critic.devices=[cpu:1, cpu:2] shares cpu:1 with the actor's devices (actor.devices=[cpu:0, cpu:1]) but "
        "not all of them; roles share all their devices (colocated) or none (a pool each): use "
        "critic.devices=[cpu:0, cpu:1], or devices no other role uses (cpu:3)",
    ),
    (
        ["critic.n_devices=1"],
        "critic.n_devices=1 gives the critic a pool of its own, but the pools before it take 2 of the cluster's 2 "
        "devices (trainer.nnodes·trainer.n_devices_per_node = 1·2): two pools would share a device "
        "(over-subscription); set critic.n_devices=null to share the actor's devices, or add devices",
    ),
    (
        [
            "trainer.n_devices_per_node=3",
            "actor.devices=[cpu:0, cpu:1]",
            "critic.devices=[cpu:2]",
            "critic.parallel.tp=2",
        ],
        "critic.parallel: tp·pp·cp = 2·1·1 = 2 does not divide the 1 device of the critic "
        "(critic.devices=[cpu:2]); make tp·pp·cp one of 1 or use a multiple of 2 devices",
    ),
    (
        ["actor.devices=[cpu:0, cpu:0]"],
        "actor.devices=[cpu:0, cpu:0] lists cpu:0 more than once; list each device once",
    ),
    (
        ["actor.devices=[]"],
        "actor.devices=[] lists no device; list at least one (e.g. [cpu:0]), or set actor.devices=null",
    ),
    (
        ["actor.devices=[cpu:0]", "critic.devices=[cpu:1]", "critic.n_devices=2"],
        "critic.n_devices=2 but critic.devices=[cpu:1] lists 1 device; set critic.n_devices=null (the devices "
        "decide) or list 2 devices",
    ),
    (
        ["trainer.launcher=torchrun", "actor.devices=[cpu:0, cpu:1]", "critic.devices=[cpu:1]"],
        "critic.devices=[cpu:1] needs trainer.launcher=ray; under torchrun every role runs in each of the 2 "
        "processes: set critic.devices=null",
    ),
    (
        [KL, "ref.parallel.tp=2"],
        "ref.parallel differs from actor.parallel, but the reference shares the actor's devices and so runs in the "
        "actor's processes with the actor's layout; set ref.parallel=null, or give the reference devices of its "
        "own (ref.devices)",
    ),
    (
        [KL, "actor.devices=[cpu:0]", "ref.devices=[cpu:1]", "ref.parallel.pp=2"],
        "ref.parallel: tp·pp·cp = 1·2·1 = 2 does not divide the 1 device of the ref (ref.devices=[cpu:1]); "
        "make tp·pp·cp one of 1 or use a multiple of 2 devices",
    ),
]


@pytest.mark.parametrize(
    "overrides, message", INVALID, ids=[i[1].split(" ")[0] + str(n) for n, i in enumerate(INVALID)]
)
def test_an_invalid_map_is_rejected_at_load_with_its_message(overrides, message):
    with pytest.raises(ConfigError) as info:
        _load(*overrides)
    assert info.value.problems == [message]


def test_every_placement_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        _load(
            "trainer.launcher=ray",
            "actor.devices=[cpu:0, cpu:5]",
            "critic.devices=[gpu:1]",
            "reward.model_path=/rm",
            "reward.devices=[]",
        )
    keys = sorted(p.split("=")[0] for p in info.value.problems)
    assert keys == ["actor.devices", "critic.devices", "reward.devices"], info.value.problems


def test_placement_refuses_a_config_built_in_python_before_any_worker_starts():
    cfg = _load("actor.devices=[cpu:0]", "critic.devices=[cpu:1]")
    cfg.critic.devices = ["cpu:0", "cpu:1"]  # edited after loading: build_roles calls placement first
    with pytest.raises(ConfigError, match=r"critic.devices=\[cpu:0, cpu:1\] shares cpu:0 with the actor's"):
        placement(cfg)
