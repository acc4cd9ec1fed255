"""ModelMixin is only used as a base class of the DiT: a plain torch.nn.Module is enough."""
from torch.nn import Module as ModelMixin  # noqa: F401
