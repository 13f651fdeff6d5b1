"""Privacy accounting: pure NumPy/SciPy, never imports torch.

* :mod:`~dpnoise.accounting.events` -- declarative DP events (what happened);
* :mod:`~dpnoise.accounting.rdp` -- Renyi-DP bounds, one module per mechanism;
* :mod:`~dpnoise.accounting.pld` -- privacy loss distributions (dp_accounting), Lap2 via GDP;
* accountants (``step`` / ``compose`` / ``get_epsilon`` / ``state_dict``): :class:`RdpAccountant`,
  :class:`PldAccountant`, :class:`ReleaseCountAccountant` (an output mechanism by its number of
  releases) and :class:`MinimumAccountant` (the smallest of several sound routes);
* :data:`MECHANISMS` -- the mechanism registry (noise unit, event, accountants, audit pair), each
  built-in mechanism one module of :mod:`~dpnoise.accounting.plugins` registered by one
  :func:`register_plugin` call (its spec, its RDP and PLD routes, its accountants);
* :data:`ACCOUNTANT_KINDS` -- kinds of accountant (rdp, pld, minimum, release-count): each kind's
  class, calibration strategy and cheap-epsilon flag, added by :func:`register_accountant_kind`;
* :data:`ACCOUNTANTS` -- named accountants (``gaussian``, ``laplace-l1``, ``lap2``, ``lap2-paper``,
  ``dirichlet``, ...), each added by :func:`register_accountant`; non-sound ones warn whenever
  they produce a number;
* calibrators for sigma, Lap2's (C, b) (Lap2 paper Algorithm 1) and the Dirichlet r*.
"""

from dpnoise.accounting.accountant import (
    MinimumAccountant,
    PldAccountant,
    PrivacyAccountant,
    RdpAccountant,
    UnsoundAccountantWarning,
    accountant_holding,
    epsilon_after,
    epsilon_of_events,
    get_accountant,
    step_event_from_keywords,
    training_step_event,
)
from dpnoise.accounting.calibration import (
    CalibrationResult,
    UnreachableTargetError,
    calibrate,
    calibrate_noise,
    clip_from_gradient_norms,
    step_event_factory,
    steps_from_epochs,
)
from dpnoise.accounting.kinds import ACCOUNTANT_KINDS, AccountantKind, register_accountant_kind
from dpnoise.accounting.mechanisms import (
    MECHANISMS,
    OUTPUT_PRIVACY_SCOPE,
    MechanismOptions,
    MechanismSpec,
    NoOptions,
    RunFacts,
    get_mechanism_spec,
    noise_from_keywords,
    noise_keywords,
    register_mechanism,
)
from dpnoise.accounting.plugin import MechanismPlugin, register_plugin, unregister_plugin
from dpnoise.accounting.registry import ACCOUNTANTS, AccountantSpec, accountants_for_mechanism, register_accountant
from dpnoise.accounting.release_count import ReleaseCountAccountant
from dpnoise.accounting.validation import InvalidParameterError

# the built-in mechanisms register themselves (last: they use everything above)
from dpnoise.accounting import plugins  # noqa: E402,F401,I001
from dpnoise.accounting.plugins.dirichlet import DirichletOptions, calibrate_dirichlet_r  # noqa: E402
from dpnoise.accounting.plugins.gaussian import calibrate_gaussian_sigma  # noqa: E402
from dpnoise.accounting.plugins.lap2 import calibrate_lap2  # noqa: E402

__all__ = [
    "ACCOUNTANT_KINDS",
    "ACCOUNTANTS",
    "MECHANISMS",
    "OUTPUT_PRIVACY_SCOPE",
    "AccountantKind",
    "AccountantSpec",
    "CalibrationResult",
    "DirichletOptions",
    "InvalidParameterError",
    "MechanismOptions",
    "MechanismPlugin",
    "MechanismSpec",
    "NoOptions",
    "MinimumAccountant",
    "PldAccountant",
    "PrivacyAccountant",
    "RdpAccountant",
    "ReleaseCountAccountant",
    "RunFacts",
    "UnreachableTargetError",
    "UnsoundAccountantWarning",
    "accountants_for_mechanism",
    "calibrate",
    "calibrate_dirichlet_r",
    "calibrate_gaussian_sigma",
    "calibrate_lap2",
    "calibrate_noise",
    "clip_from_gradient_norms",
    "accountant_holding",
    "epsilon_after",
    "epsilon_of_events",
    "get_accountant",
    "step_event_from_keywords",
    "training_step_event",
    "get_mechanism_spec",
    "noise_from_keywords",
    "noise_keywords",
    "register_accountant",
    "register_accountant_kind",
    "register_mechanism",
    "register_plugin",
    "unregister_plugin",
    "step_event_factory",
    "steps_from_epochs",
]
