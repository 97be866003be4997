"""Every option the schema spells as a Literal names exactly what the implementing code accepts, both ways."""

import inspect
import typing

import pytest
import torch

from megarl.algorithms.advantages import ESTIMATORS
from megarl.algorithms.aggregate import LOSS_AGG_MODES, aggregate
from megarl.algorithms.estimator_traits import ESTIMATOR_TRAITS
from megarl.algorithms.kl import KL_CONTROLLERS, KL_ESTIMATORS, build_kl_controller, kl_penalty
from megarl.algorithms.loss_traits import DUAL_CLIP_LOSSES, LOSS_PARAMS, SEQUENCE_MEAN_LOSSES
from megarl.algorithms.pf_ppo import REWEIGHT_METHODS
from megarl.algorithms.policy_loss import POLICY_LOSSES
from megarl.algorithms.rollout_correction import IS_LEVELS, RS_LEVELS
from megarl.config import options
from megarl.models import dtypes
from megarl.models.from_hf import FAMILIES
from megarl.models.optimizer import MEGATRON_OPTIMIZERS
from megarl.workers import reward_hf

pytestmark = pytest.mark.unit

# schema Literal -> the names its implementation accepts
VOCABULARIES = {
    "AdvEstimator": ESTIMATORS,
    "LossAggMode": LOSS_AGG_MODES,
    "KlEstimator": KL_ESTIMATORS,
    "KlController": KL_CONTROLLERS,
    "PolicyLoss": POLICY_LOSSES,
    "IsLevel": IS_LEVELS,
    "RsLevel": RS_LEVELS,
    "PfPpoReweight": REWEIGHT_METHODS,
    "Dtype": dtypes.DTYPE_NAMES,
    "RewardKind": reward_hf.KINDS,
    "OptimizerName": MEGATRON_OPTIMIZERS,
    "ModelType": FAMILIES,
}


@pytest.mark.parametrize("literal", VOCABULARIES)
def test_schema_literal_equals_the_implemented_names(literal):
    choices = typing.get_args(getattr(options, literal))
    implemented = list(VOCABULARIES[literal])
    assert sorted(choices) == sorted(implemented), f"options.{literal} and its implementation disagree"


def test_every_estimator_has_traits_that_match_its_signature():
    assert list(ESTIMATOR_TRAITS) == list(ESTIMATORS)
    for name, estimator in ESTIMATORS.items():
        params = inspect.signature(estimator).parameters
        traits = ESTIMATOR_TRAITS[name]
        assert traits.needs_critic == ("values" in params), name
        assert traits.needs_group == ("group_ids" in params), name
        assert traits.needs_sum_pi_squared == ("sum_pi_squared" in params), name
        assert not traits.std_norm_flag or "norm_by_std" in params, name


def test_every_policy_loss_has_its_parameter_table():
    assert list(LOSS_PARAMS) == list(POLICY_LOSSES)
    assert set(SEQUENCE_MEAN_LOSSES) | set(DUAL_CLIP_LOSSES) <= set(POLICY_LOSSES)
    for name, loss in POLICY_LOSSES.items():
        params = inspect.signature(loss).parameters
        assert all(params[p].default == d for p, d in LOSS_PARAMS[name].items()), name


def test_every_listed_name_is_implemented():
    values, mask = torch.ones(2, 3), torch.ones(2, 3)
    for mode in LOSS_AGG_MODES:
        aggregate(values, mask, mode)
    for estimator in KL_ESTIMATORS:
        kl_penalty(values, values, estimator)
    for kind in KL_CONTROLLERS:
        build_kl_controller(kind, 0.1)
    for name in dtypes.DTYPE_NAMES:
        assert isinstance(dtypes.torch_dtype(name), torch.dtype)


def test_reward_hf_kind_literal_is_the_schemas():
    assert typing.get_args(reward_hf.RewardKind) == typing.get_args(options.RewardKind)
