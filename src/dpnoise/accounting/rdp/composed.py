"""RDP of one Poisson subsample released through several mechanisms at once (a jointly subsampled
composition): adaptive clipping's step releases the noisy clipped gradient sum and a noisy count of the same
batch (Andrew et al., "Differentially Private Learning with Adaptive Clipping", arXiv 1905.03871).

Composing the two mechanisms each on its own Poisson subsample is *not* an upper bound here: the changed
example is in both releases or in neither, and at order 2 the joint log-moment is
log(1 + q^2 (e^{R1 + R2} - 1)), above the separate ones' sum log(1 + q^2 (e^{R1} - 1)) + log(1 + q^2 (e^{R2} - 1)).
The subsampled mechanism here is the pair itself: given the other examples, the pair's noises are
independent, so E_Q[(P/Q)^eta] of the pair is the product of the mechanisms' and its log-moments are the sum
R = R1 + R2 of theirs (each a bound over its own sensitivity set, symmetric noise), which
:func:`~dpnoise.accounting.rdp.subsampling.sound_subsampled_rdp` turns into the subsampled RDP.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from dpnoise.accounting.events import GaussianEvent, Lap2Event, LaplaceEvent
from dpnoise.accounting.rdp.gaussian import gaussian_base_log_moments
from dpnoise.accounting.rdp.lap2 import lap2_base_log_moments
from dpnoise.accounting.rdp.laplace import laplace_base_log_moments
from dpnoise.accounting.rdp.subsampling import sound_subsampled_rdp

#: event type -> (event, max_order) -> R[eta], eta = 0..max_order: a bound on sup log E_Q[(P/Q)^eta] over
#: the mechanism's sensitivity set (one clipping norm: the L2 ball for Gaussian and Lap2, the L1 ball for
#: Laplace, where log F is superadditive), both directions (symmetric noise)
BASE_LOG_MOMENTS: dict[type, Callable[[Any, int], np.ndarray]] = {
    GaussianEvent: lambda event, max_order: gaussian_base_log_moments(event.noise_multiplier, max_order),
    LaplaceEvent: lambda event, max_order: laplace_base_log_moments(event.noise_multiplier, max_order),
    Lap2Event: lambda event, max_order: lap2_base_log_moments(event.noise_multiplier, event.num_params, max_order),
}


def composed_base_log_moments(events: tuple[Any, ...], max_order: int) -> np.ndarray:
    """R[eta] of the mechanisms ``events`` releasing the same data with independent noises: the sum of
    theirs (module docstring)."""
    unknown = [type(event).__name__ for event in events if type(event) not in BASE_LOG_MOMENTS]
    if unknown:
        raise NotImplementedError(f"no base log-moments for {', '.join(unknown)}: a jointly subsampled "
                                  f"composition is accounted for {', '.join(t.__name__ for t in BASE_LOG_MOMENTS)}")
    return sum(BASE_LOG_MOMENTS[type(event)](event, max_order) for event in events)


def jointly_subsampled_rdp(q: float, events: tuple[Any, ...], orders: np.ndarray) -> np.ndarray:
    """RDP at ``orders`` (integer orders; +inf at the others) of ``events`` released on one Poisson subsample
    at rate ``q``, both add/remove directions."""
    composed_base_log_moments(events, 2)  # refuses an event without base log-moments before any order
    return sound_subsampled_rdp(q, orders, lambda max_order: composed_base_log_moments(events, max_order))
