"""A reward file is checked before any worker starts: imported in a process of its own (a crash, an
`os._exit` or a hang at import is an error naming the file, and the driver lives on) and its function's
signature bound against verl's call `fn(data_source, solution_str, ground_truth, extra_info)`."""

from __future__ import annotations

import os

import pytest

from megarl.config.schema import RewardFunctionConfig, RewardModelConfig
from megarl.rewards import RewardComputer, RewardError
from megarl.rewards.function_check import check_reward_file, signature_problem
from tests.unit.rewards.test_computer import reward_file

pytestmark = pytest.mark.unit

# verl's own examples/…/reward_score/gsm8k.py signature: a per-source scorer, no data_source
VERL_GSM8K = """
def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    return 0.0
"""


def test_verl_gsm8k_scorer_as_reward_function_fails_before_any_worker_with_a_wrapper_hint(
    tmp_path, tokenizer
):
    path = reward_file(tmp_path, VERL_GSM8K, "gsm8k.py")
    cfg = RewardModelConfig(function=RewardFunctionConfig(path=path), workers=2)
    with pytest.raises(RewardError) as info:
        RewardComputer(cfg, tokenizer)
    assert str(info.value) == (
        f"reward.function.name=compute_score in reward.function.path={path} cannot be called as verl and megarl "
        "call it, compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...): "
        "compute_score(solution_str, ground_truth, method='strict', format_score=0.0, score=1.0) has no parameter "
        "data_source or extra_info. This is one of verl's per-source scorers (verl/utils/reward_score/*.py, e.g. "
        "gsm8k.py's compute_score(solution_str, ground_truth, method=..., ...)), not a reward function. Either "
        "remove reward.function to score with megarl's rule reward for the rows' data_source (docs/verl-rewards.md "
        "lists them), or wrap it: a file of your own with `def compute_score(data_source, solution_str, "
        "ground_truth, extra_info=None): return verl_score(solution_str, ground_truth)`, where verl_score is this "
        f"function, pasted in or imported (`from gsm8k import compute_score as verl_score`, with {tmp_path} on "
        "PYTHONPATH)"
    )


@pytest.mark.parametrize(
    "params",
    [
        "data_source, solution_str, ground_truth, extra_info=None",
        "data_source, solution_str, ground_truth, extra_info",
        "solution_str, ground_truth, **kwargs",
        "*, data_source, solution_str, ground_truth, extra_info=None, scale=1.0",
        "*args, **kwargs",
    ],
)
def test_what_verls_call_binds_to_is_accepted(params):
    namespace: dict = {}
    exec(f"def f({params}): return 0.0", namespace)
    assert signature_problem(namespace["f"], "r.py", "f") is None


def test_a_required_parameter_verl_does_not_pass_is_named_with_the_fix():
    def f(data_source, solution_str, ground_truth, extra_info, tokenizer):
        return 0.0

    assert signature_problem(f, "r.py", "f") == (
        "reward.function.name=f in reward.function.path=r.py cannot be called as verl and megarl call it, "
        "f(data_source=..., solution_str=..., ground_truth=..., extra_info=...): "
        "f(data_source, solution_str, ground_truth, extra_info, tokenizer) requires tokenizer, which verl's call "
        "does not pass; give tokenizer a default"
    )


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("import os\nos._exit(4)\n", "ended the process with exit code 4 (os._exit"),
        ("import ctypes\nctypes.string_at(0)\n", "died with signal 11 (SIGSEGV) while being imported"),
        ("import time\ntime.sleep(60)\n", "did not finish importing within 2s"),
        ("import sys\nsys.exit(2)\n", "called sys.exit(2) while being imported"),
        ("raise ValueError('no config')\n", "failed to import: ValueError: no config; fix the file"),
    ],
)
def test_a_file_that_crashes_exits_or_hangs_at_import_is_an_error_naming_it(tmp_path, body, said):
    path = reward_file(
        tmp_path,
        body + "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0\n",
    )
    with pytest.raises(RewardError, match=f"reward.function.path={path}") as info:
        check_reward_file(path, "compute_score", timeout_s=2.0 if "sleep" in body else 60.0)
    assert said in str(info.value)
    assert os.getpid() > 0  # this process lives on


def test_with_workers_the_driver_never_imports_the_file(tmp_path, tokenizer):
    marker = tmp_path / "imported_in"
    path = reward_file(
        tmp_path,
        f"import os\nopen({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
    )
    computer = RewardComputer(
        RewardModelConfig(function=RewardFunctionConfig(path=path), workers=1), tokenizer
    )
    computer.close()
    pids = marker.read_text().split()
    assert len(pids) == 1 and int(pids[0]) != os.getpid()
