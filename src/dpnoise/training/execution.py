"""How a private run executes, apart from what it releases (torch-free): Poisson sampling, the source
of per-example gradients, the device, physical batches and, in a process group, who adds the noise.

:class:`ExecutionOptions` is frozen, keyword-only and checked when built (every error names its
option); with :class:`~dpnoise.training.privacy_plan.PrivacyOptions` it is what
:meth:`~dpnoise.training.engine.PrivacyEngine.make_private_with_options` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from dpnoise.accounting.validation import check_count
from dpnoise.training.errors import InvalidTrainingOptionError

GradSampleMode = Literal["auto", "bookkeeping", "hooks"]
GRAD_SAMPLE_MODES: tuple[str, ...] = ("auto", "bookkeeping", "hooks")
#: who adds the noise in a process group: every rank a share, or rank 0 all of it (docs/DISTRIBUTED.md)
NOISE_SHARES: tuple[str, ...] = ("split", "rank0")


@dataclass(frozen=True, kw_only=True)
class ExecutionOptions:
    """The execution options of ``make_private`` (same names and meaning, see its docstring).

    ``device``: "cpu", "cuda", "cuda:i", "auto", a ``torch.device``, or None (the module's device).
    """

    poisson_sampling: bool = True
    grad_sample_mode: GradSampleMode = "auto"
    device: Optional[Any] = None
    noise_shares: str = "split"
    max_physical_batch_size: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.poisson_sampling, bool):
            raise InvalidTrainingOptionError(f"poisson_sampling must be True or False, got {self.poisson_sampling!r}")
        if self.grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise InvalidTrainingOptionError(
                f"grad_sample_mode must be one of {', '.join(GRAD_SAMPLE_MODES)}, got {self.grad_sample_mode!r}")
        if self.max_physical_batch_size is not None:
            object.__setattr__(self, "max_physical_batch_size",
                               check_count("max_physical_batch_size", self.max_physical_batch_size, 1))
            if not self.poisson_sampling:
                raise InvalidTrainingOptionError("max_physical_batch_size splits Poisson batches; it needs "
                                                 "poisson_sampling=True")
        if self.noise_shares not in NOISE_SHARES:
            raise InvalidTrainingOptionError(
                f"noise_shares must be one of {', '.join(NOISE_SHARES)}, got {self.noise_shares!r}")
