"""optimizer_config: dicts, OptimizerConfigs and torch optimizers mapped onto megarl's OptimizerConfig,
and every torch setting megatron cannot reproduce refused by name."""

import pytest
import torch

from megarl.api.optimizers import UnsupportedOptimizerError, optimizer_config
from megarl.config.errors import ConfigError
from megarl.config.schema import OptimizerConfig
from megarl.errors import EXIT_USAGE

pytestmark = pytest.mark.unit


def params(n: int = 1) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(2)) for _ in range(n)]


def test_torch_adamw_maps_lr_betas_eps_and_weight_decay():
    opt = torch.optim.AdamW(params(), lr=3e-6, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, fused=False)
    cfg = optimizer_config(opt)
    assert cfg == OptimizerConfig(name="adamw", lr=3e-6, betas=[0.8, 0.95], eps=1e-6, weight_decay=0.1)


def test_torch_adam_is_l2_adam_unless_its_weight_decay_is_decoupled():
    assert optimizer_config(torch.optim.Adam(params(), lr=1e-5, weight_decay=0.2)) == OptimizerConfig(
        name="adam", lr=1e-5, weight_decay=0.2
    )
    decoupled = torch.optim.Adam(params(), lr=1e-5, weight_decay=0.2, decoupled_weight_decay=True)
    assert optimizer_config(decoupled).name == "adamw"


def test_torch_sgd_maps_momentum_and_turns_the_distributed_optimizer_off():
    cfg = optimizer_config(torch.optim.SGD(params(), lr=0.1, momentum=0.9, weight_decay=0.01))
    assert (cfg.name, cfg.lr, cfg.momentum, cfg.weight_decay) == ("sgd", 0.1, 0.9, 0.01)
    assert cfg.use_distributed_optimizer is False  # megatron shards Adam only


def test_settings_torch_has_no_word_for_come_from_base():
    base = OptimizerConfig(clip_grad=0.5, lr_warmup_steps=3, lr_decay_style="cosine", min_lr=1e-7)
    cfg = optimizer_config(torch.optim.AdamW(params(), lr=1e-6), base=base)
    assert (cfg.clip_grad, cfg.lr_warmup_steps, cfg.lr_decay_style, cfg.min_lr) == (0.5, 3, "cosine", 1e-7)
    assert cfg.lr == 1e-6 and base.lr == OptimizerConfig().lr  # base is not changed


def test_kernel_choices_are_ignored():
    for kernel in ({"foreach": True}, {"fused": True}, {"capturable": True}):
        assert optimizer_config(torch.optim.AdamW(params(), lr=1e-6, **kernel)).lr == 1e-6


def test_a_scheduled_optimizer_gives_its_initial_lr():
    opt = torch.optim.AdamW(params(), lr=1e-5)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0)  # a warm-up: lr is 0 now
    assert opt.param_groups[0]["lr"] == 0 and optimizer_config(opt).lr == 1e-5


def test_a_decay_no_decay_split_counts_as_its_weight_decay():
    decay, no_decay = params(), params()
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], weight_decay=0.05)
    assert optimizer_config(opt).weight_decay == 0.05


def test_a_dict_is_applied_over_base_and_checked():
    cfg = optimizer_config({"name": "sgd", "lr": "1e-3", "use_distributed_optimizer": False, "momentum": 0.5})
    assert (cfg.name, cfg.lr, cfg.momentum) == ("sgd", 1e-3, 0.5)
    assert optimizer_config({"lr": 2e-6}, base=OptimizerConfig(clip_grad=0.3)).clip_grad == 0.3


def test_an_optimizer_config_is_returned_once_checked():
    cfg = OptimizerConfig(lr=2e-6)
    assert optimizer_config(cfg) is cfg
    with pytest.raises(ConfigError, match=r"optimizer.lr=0.0 must be > 0"):
        optimizer_config(OptimizerConfig(lr=0.0))


@pytest.mark.parametrize(
    "values, message",
    [
        ({"lr": 1e-5, "learning_rate": 1}, r"unknown key 'optimizer.learning_rate' — valid keys: name, lr, "),
        ({"nme": "sgd"}, r"unknown key 'optimizer.nme' — did you mean 'name'\?"),
        ({"lr": "fast"}, r"optimizer.lr='fast' is invalid"),
        ({"name": "rmsprop"}, r"optimizer.name='rmsprop' is invalid"),
        (
            {"name": "sgd", "momentum": 1.0, "use_distributed_optimizer": False},
            r"momentum=1.0 must be in \[0, 1\)",
        ),
        ({"name": "sgd"}, r"name=sgd needs optimizer.use_distributed_optimizer=false"),
        ({"momentum": 0.9}, r"optimizer.momentum=0.9 is SGD's"),
        ({"lr": 1e-6, "min_lr": 1e-5}, r"optimizer.min_lr=1e-05 must be in \[0, optimizer.lr=1e-06\]"),
    ],
)
def test_bad_dicts_are_config_errors(values, message):
    with pytest.raises(ConfigError, match=message) as e:
        optimizer_config(values)
    assert e.value.exit_code == EXIT_USAGE


def _groups_differing(key, a, b):
    return [{"params": params(), key: a}, {"params": params(), key: b}]


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: torch.optim.RMSprop(params()),
            r"^RMSprop has no Megatron equivalent; use AdamW, Adam or SGD$",
        ),
        (lambda: torch.optim.Adagrad(params()), r"^Adagrad has no Megatron equivalent"),
        (lambda: type("MyAdamW", (torch.optim.AdamW,), {})(params()), r"^MyAdamW has no Megatron equivalent"),
        (
            lambda: torch.optim.AdamW(params(), amsgrad=True),
            r"AdamW\(amsgrad=True\) has no Megatron equivalent",
        ),
        (
            lambda: torch.optim.Adam(params(), maximize=True),
            r"Adam\(maximize=True\) has no Megatron equivalent",
        ),
        (lambda: torch.optim.AdamW(params(), differentiable=True), r"AdamW\(differentiable=True\)"),
        (
            lambda: torch.optim.SGD(params(), momentum=0.9, nesterov=True),
            r"SGD\(nesterov=True\).*nesterov=False",
        ),
        (
            lambda: torch.optim.SGD(params(), momentum=0.9, dampening=0.1),
            r"SGD\(dampening=0.1\).*dampening=0",
        ),
        (lambda: torch.optim.Adam(params(), lr=torch.tensor(1e-3), foreach=False), r"Adam\(lr=<tensor>\)"),
        (
            lambda: torch.optim.AdamW(_groups_differing("lr", 1e-3, 1e-4)),
            r"AdamW param group 1 has lr=0.0001",
        ),
        (
            lambda: torch.optim.AdamW(_groups_differing("betas", (0.9, 0.99), (0.9, 0.9))),
            r"group 1 has betas=",
        ),
        (lambda: torch.optim.Adam(_groups_differing("eps", 1e-8, 1e-6)), r"Adam param group 1 has eps=1e-06"),
        (
            lambda: torch.optim.SGD(_groups_differing("momentum", 0.9, 0.5)),
            r"SGD param group 1 has momentum=0.5",
        ),
        (
            lambda: torch.optim.AdamW(_groups_differing("weight_decay", 0.1, 0.2)),
            r"weight_decay=\[0.1, 0.2\]",
        ),
        (lambda: "adamw", r"optimizer=str is not an optimizer"),
    ],
)
def test_what_megatron_cannot_reproduce_is_refused_by_name(make, message):
    with pytest.raises(UnsupportedOptimizerError, match=message) as e:
        optimizer_config(make())
    assert e.value.exit_code == EXIT_USAGE
