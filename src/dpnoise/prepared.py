"""What ``accelerate``'s ``prepare()`` reads of dpnoise's private objects (a utility any layer may import).

accelerate leaves an object alone when its ``_is_accelerate_prepared`` is true (it marks every object it
returns, so that it never wraps one twice).  dpnoise's private module and loader answer true, because what
``prepare()`` would do to them is dpnoise's own job already and done differently: it would re-deal the
loader's batches between the processes (rank r taking every K-th batch, padding the shorter rank with an
earlier one), whereas each rank's private loader already draws its own shard of every Poisson batch; and it
would wrap the module in ``DistributedDataParallel``, which averages the parameter gradients, whereas the
private optimizer all-reduces the ranks' noisy clipped sums itself (docs/DISTRIBUTED.md).

Before answering, the descriptor runs the check the engine left on the object (:func:`leave_to_dpnoise`),
which refuses an accelerate setup the private objects do not serve as they are (mixed precision, gradient
accumulation, another device or number of processes), naming the setting.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

#: the instance attribute holding the check (absent: not made private, accelerate prepares it as usual)
CHECK = "_dpnoise_accelerate_check"


class PreparedForAccelerate:
    """The class attribute ``_is_accelerate_prepared`` of the private modules and loader."""

    def __get__(self, obj: Any, kind: Optional[type] = None) -> Any:
        if obj is None:
            return self
        check = obj.__dict__.get(CHECK)
        if check is None:
            return False
        check()
        return True

    def __set__(self, obj: Any, value: Any) -> None:
        """accelerate marks what ``prepare()`` returned: a private object keeps its own answer."""


def leave_to_dpnoise(obj: Any, check: Callable[[], None]) -> None:
    """Make ``obj`` (of a class with :class:`PreparedForAccelerate`) tell accelerate it is prepared, after
    ``check()`` (which raises for a setup it does not serve)."""
    obj.__dict__[CHECK] = check
