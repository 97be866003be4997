"""The Python API's objects without processes: controllers, roles, ports, reward weights, config keys."""

from __future__ import annotations

import pytest

import megarl
from megarl.api.controllers import ControllerError, materialize
from megarl.api.rewards import weighted
from megarl.api.trainers import _settings
from megarl.config import ConfigError, config_from, load_config
from megarl.trainer.dataflow import Dataflow, DataflowError, Stage


def test_the_articles_imports_and_roles_work():
    from megarl import ActorController, CriticController, DeviceMap, PPOTrainer, RewardController  # noqa: F401

    rm1, rm2 = (
        megarl.RewardController(rule="digits_reverse"),
        megarl.RewardController(function=len, name="length"),
    )
    roles = megarl.Roles(actor=megarl.ActorController("m"), reward_models=[rm1, (rm2, 0.5)])
    assert [(rc.name, w) for rc, w in weighted(roles.reward_models)] == [
        ("digits_reverse", 1.0),
        ("length", 0.5),
    ]


def test_reward_controllers_take_one_source_and_need_distinct_names():
    with pytest.raises(ControllerError, match="one of model=, function= or rule="):
        megarl.RewardController("rm", function=len)
    with pytest.raises(ControllerError, match="must be callable"):
        megarl.RewardController(function=3)
    with pytest.raises(ControllerError, match="distinct names"):
        weighted([megarl.RewardController(function=len), megarl.RewardController(function=len)])
    with pytest.raises(ControllerError, match="pass a RewardController"):
        weighted(["gsm8k"])
    assert megarl.RewardController("path/to/rm").name == "reward_model"
    assert megarl.RewardController().name == "rule"


def test_trainers_refuse_the_roles_their_algorithm_does_not_use():
    actor = megarl.ActorController("m")
    with pytest.raises(ControllerError, match="PPOTrainer needs critic="):
        megarl.PPOTrainer(actor=actor)
    with pytest.raises(ControllerError, match="GRPOTrainer uses no critic"):
        megarl.GRPOTrainer(actor=actor, critic=megarl.CriticController())
    with pytest.raises(ControllerError, match="critic=.*pass a CriticController"):
        megarl.PPOTrainer(actor=actor, critic=megarl.RewardController())


def test_controllers_become_the_config_keys_the_cli_would_set(tmp_path):
    actor = megarl.ActorController(
        "models/sft", optimizer={"lr": 1e-3, "weight_decay": 0.0}, micro_batch_size=8
    )
    critic = megarl.CriticController(optimizer={"lr": 1e-4})
    roles = megarl.Roles(actor=actor, critic=critic, reference=megarl.ReferenceController())
    settings = _settings(roles, tmp_path, {"name": "ppo", "adv_estimator": "gae"}, None)
    cfg = config_from(
        {"data.train_batch_size": 8, "algorithm.ppo_mini_batch_size": 8}, settings, check_paths=False
    )
    assert cfg.model.path == "models/sft" and cfg.actor.micro_batch_size == 8
    assert cfg.actor.optimizer.lr == 1e-3 and cfg.critic.optimizer.lr == 1e-4
    assert cfg.critic.enable and cfg.ref.enable and not cfg.reward.enable
    assert cfg.algorithm.adv_estimator == "gae" and cfg.data.train_batch_size == 8


def test_a_controllers_unknown_key_gets_the_clis_message(tmp_path):
    roles = megarl.Roles(actor=megarl.ActorController("m", micro_batch=8))
    settings = _settings(roles, tmp_path, {"name": "grpo"}, None)
    with pytest.raises(ConfigError) as api:
        config_from(None, settings, check_paths=False)
    with pytest.raises(ConfigError) as cli:
        load_config(None, ["actor.micro_batch=8"], check_paths=False)
    assert "unknown key 'actor.micro_batch' — did you mean 'actor.micro_batch_size'?" in str(api.value)
    assert str(cli.value) in str(api.value)


def test_a_config_comes_as_a_dict_with_dotted_keys_a_megarlconfig_or_a_yaml_path(tmp_path):
    yaml = tmp_path / "run.yaml"
    yaml.write_text("actor:\n  optimizer: {lr: 0.5}\n")
    from_yaml = config_from(yaml, check_paths=False)
    from_dict = config_from({"actor": {"optimizer.lr": 0.5}}, check_paths=False)
    assert from_yaml == from_dict == config_from(from_dict, check_paths=False)
    with pytest.raises(ConfigError, match="pass a dict, a MegarlConfig or the path"):
        config_from(3, check_paths=False)


def test_a_reference_must_be_the_actors_starting_checkpoint(tmp_path):
    roles = megarl.Roles(actor=megarl.ActorController("a"), reference=megarl.ReferenceController("b"))
    with pytest.raises(ControllerError, match="must be the actor's checkpoint"):
        _settings(roles, tmp_path, {}, None)


def test_an_in_memory_model_is_written_where_the_ranks_read_it(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    path = materialize(model, tmp_path / "actor")
    assert path == str(tmp_path / "actor") and (tmp_path / "actor" / "model.safetensors").exists()
    assert materialize("models/x", tmp_path) == "models/x"  # not here: left as given (a remote path)
    with pytest.raises(ControllerError, match="checkpoint directory or a transformers.PreTrainedModel"):
        materialize(object(), tmp_path)


def test_ports_connect_an_output_to_an_input_that_reads_one_of_its_columns():
    actor, critic = megarl.ActorController("m"), megarl.CriticController()
    rm = megarl.RewardController("rm")
    flow = Dataflow(inputs=("prompts", "attention_mask"))
    flow.add_stage(Stage("generate", lambda c, b: None, reads=("prompts",), writes=actor.output.columns))
    flow.add_stage(Stage("reward_model", lambda c, b: None, reads=rm.input.columns, writes=("reward_model",)))
    flow.add_stage(Stage("values", lambda c, b: None, reads=("responses",), writes=("values",)))
    flow.connect(actor.output, rm.input)
    assert ("generate", "reward_model") in flow._edges
    with pytest.raises(DataflowError, match="takes an output then an input; got reward_model.input"):
        flow.connect(rm.input, actor.output)
    with pytest.raises(DataflowError, match="critic.values writes values; .* no column in common"):
        flow.connect(critic.values, actor.input)
    with pytest.raises(DataflowError, match="no stage named 'ref_log_prob' in this flow"):
        flow.connect(actor.output, megarl.ReferenceController().input)


def test_a_flow_takes_stages_and_controller_methods_and_says_what_else_to_pass():
    flow = Dataflow(inputs=("responses",))
    with pytest.raises(DataflowError, match="a flow takes a Stage or a controller method"):
        flow.add_stage(lambda ctx, batch: None)
    rc = megarl.RewardController(function=len, name="length")
    with pytest.raises(ControllerError, match="not used by a trainer yet|add length.score"):
        flow.add_stage(rc.score)
    rc.scorer = Stage("length", lambda c, b: None, reads=("responses",), writes=("length",))
    flow.add_stage(rc.score)
    assert flow.names == ["length"]


def test_flow_run_needs_steps_or_a_batch_and_a_trainer():
    flow = megarl.Dataflow()
    with pytest.raises(DataflowError, match="flow.run\\(steps=N\\) or flow.run\\(num_epochs=N\\) trains"):
        flow.run()
    with pytest.raises(DataflowError, match="belongs to no trainer"):
        flow.run(steps=2)


def test_a_trained_role_picks_its_backend_by_name_or_by_its_device_map():
    assert megarl.ActorController("m").section()["backend"] == "megatron"
    assert megarl.ActorController("m", backend="fsdp").section()["backend"] == "fsdp"
    fsdp_map = megarl.DeviceMap("fsdp", ["cpu:0", "cpu:1"])
    assert megarl.CriticController(devices=fsdp_map).section()["backend"] == "fsdp"
    with pytest.raises(ControllerError, match="backend='megatron' .megatron-core. or backend='fsdp'"):
        megarl.ActorController("m", backend="deepspeed")
    with pytest.raises(ControllerError, match="the map runs the role on FSDP; drop backend="):
        megarl.CriticController(backend="megatron", devices=fsdp_map)


def test_flow_run_trains_the_steps_or_epochs_it_is_given_more():
    from types import SimpleNamespace

    from megarl.api.trainers import ControllerTrainer

    calls = []
    history = [{"step": s} for s in range(1, 12)]

    def fit(total_steps):
        calls.append(total_steps)
        return history[:total_steps]

    trainer = SimpleNamespace(done_step=3, loader=SimpleNamespace(steps_per_epoch=4), fit=fit)
    assert ControllerTrainer.run_for(trainer, num_epochs=2) == history[3:11]  # 2 epochs of 4 steps more
    assert ControllerTrainer.run_for(trainer, steps=1) == history[3:4]
    assert calls == [11, 4]
    with pytest.raises(ControllerError, match="one of steps= or num_epochs="):
        ControllerTrainer.run_for(trainer, steps=1, num_epochs=1)
    with pytest.raises(ControllerError, match="run at least one step"):
        ControllerTrainer.run_for(trainer, steps=0)
