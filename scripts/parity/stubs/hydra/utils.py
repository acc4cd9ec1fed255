"""instantiate(): objects pass through; a mapping with `_target_` is imported and called."""
import importlib
from collections.abc import Mapping


def _locate(path):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def instantiate(config, *args, **kwargs):
    if not isinstance(config, Mapping) or "_target_" not in config:
        return config
    params = {k: instantiate(v) for k, v in config.items() if k != "_target_"}
    params.update(kwargs)
    return _locate(config["_target_"])(*args, **params)
