"""The programmable API: controllers per role, device maps, PPOTrainer/GRPOTrainer: thin layers over the
trainer's worker groups and stage graph (one code path with the config/CLI)."""
