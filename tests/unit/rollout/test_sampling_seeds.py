"""Per-request sampling seeds (megarl.rollout.vllm.request_seeds): prompt i of a generate call gets one
seed whatever the number of generation replicas, a fresh one at every call."""

from megarl.rollout.vllm import request_seeds


def test_a_prompt_gets_its_seed_whatever_the_number_of_replicas():
    whole = request_seeds(7, replica=0, step=3, n_prompts=8)
    halves = request_seeds(7, replica=0, step=3, n_prompts=4) + request_seeds(
        7, replica=1, step=3, n_prompts=4
    )
    quarters = [s for r in range(4) for s in request_seeds(7, replica=r, step=3, n_prompts=2)]
    assert whole == halves == quarters
    assert len(set(whole)) == 8
    assert not set(whole) & set(request_seeds(7, replica=0, step=4, n_prompts=8))  # fresh every call
