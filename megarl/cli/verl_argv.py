"""verl's command-line habits that are not overrides: `python3 -m verl.trainer.main_ppo key=value ...`
has no config file, and hydra's `--config-path` / `--config-name` flags pick verl's YAML."""

from __future__ import annotations

import os
import sys

# hydra's flags that choose verl's own YAML: megarl starts from its defaults (docs/verl-migration.md lists
# where verl's ppo_trainer.yaml / ppo_megatron_trainer.yaml differ)
HYDRA_CONFIG_FLAGS = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn")


def split_config(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """(the YAML path or None, the overrides): a first argument that is `key=value` (or hydra's `~key`)
    and no file is an override, as on verl's command line."""
    hydra_delete = config is not None and config.startswith("~") and "/" not in config
    if config is not None and ("=" in config or hydra_delete) and not os.path.isfile(config):
        return None, [config, *overrides]
    return config, list(overrides)


def drop_hydra_flags(extra: list[str]) -> list[str]:
    """`extra` without hydra's config-choosing flags (each noted once on stderr)."""
    kept = []
    for arg in extra:
        if arg.split("=", 1)[0] in HYDRA_CONFIG_FLAGS:
            print(
                f"megarl: ignoring verl's {arg}: megarl starts from its own defaults and the given CONFIG "
                "(docs/verl-migration.md lists where verl's defaults differ)",
                file=sys.stderr,
            )
        else:
            kept.append(arg)
    return kept
