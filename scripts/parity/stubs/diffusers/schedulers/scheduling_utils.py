"""SchedulerMixin, SchedulerOutput and KarrasDiffusionSchedulers as the UniPC scheduler uses them."""
import dataclasses
import enum
from typing import Any


class SchedulerMixin:
    pass


@dataclasses.dataclass
class SchedulerOutput:
    prev_sample: Any


class KarrasDiffusionSchedulers(enum.Enum):
    DDIMScheduler = 1
    DPMSolverMultistepScheduler = 2
    EulerDiscreteScheduler = 3
    UniPCMultistepScheduler = 4
