"""ConfigMixin and @register_to_config: the constructor's bound arguments become `self.config`."""
import functools
import inspect
import types


class ConfigMixin:
    config_name = None

    def register_to_config(self, **kwargs):
        config = self.__dict__.get("config")
        if config is None:
            config = types.SimpleNamespace()
            object.__setattr__(self, "config", config)
        for key, value in kwargs.items():
            setattr(config, key, value)


def register_to_config(init):
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = {k: v for k, v in bound.arguments.items() if k != "self"}
        extra = values.pop("kwargs", None)
        if isinstance(extra, dict):
            values.update(extra)
        # NOTE: set before the constructor runs (it may read or update its own config), and with
        # object.__setattr__ so that torch.nn.Module's bookkeeping is not needed yet.
        object.__setattr__(self, "config", types.SimpleNamespace(**values))
        init(self, *args, **kwargs)

    return wrapper
