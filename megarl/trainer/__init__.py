"""The trainers: the RL step as a dataflow of stages (PPO, GRPO, RLOO, REINFORCE++, ReMax) and SFT."""
