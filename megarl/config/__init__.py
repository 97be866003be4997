"""Typed configuration: `schema` documents every knob, `load` reads YAML + overrides, `validate` checks."""

from megarl.config.load import config_from, config_to_yaml, load_config, settings_as_megarl
from megarl.config.schema import MegarlConfig, padded_vocab_size
from megarl.config.validate import ConfigError, resolve_auto, validate

__all__ = [
    "ConfigError",
    "MegarlConfig",
    "config_from",
    "config_to_yaml",
    "load_config",
    "padded_vocab_size",
    "resolve_auto",
    "settings_as_megarl",
    "validate",
]
