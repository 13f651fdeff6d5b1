"""Privacy audits: exact PLD lower bounds, empirical sampler audits, training-level audits.

* :mod:`~dpnoise.audit.pld` -- exact lower bounds on eps(delta) for feasible worst-case pairs
  (pure NumPy/SciPy);
* :func:`audit_bound` -- an accountant's claim vs that lower bound;
* :func:`audit_sampler` -- the library's clipping + noise sampler on a canary pair (torch);
* :func:`audit_one_run`, :func:`audit_dirichlet_leakage` -- training-level audits (torch).

Every audit returns a dict with ``claimed_epsilon``, ``lower_bound_epsilon``, ``consistent`` and,
for the statistical ones, ``confidence``.  The torch-based audits are imported lazily so that the
PLD bounds stay usable without torch.
"""

from dpnoise.audit.bound import audit_bound
from dpnoise.audit.pld import lower_bound

__all__ = ["audit_bound", "lower_bound", "audit_sampler", "audit_one_run", "audit_dirichlet_leakage"]


def __getattr__(name: str):
    if name == "audit_sampler":
        from dpnoise.audit.sampler import audit_sampler

        return audit_sampler
    if name in ("audit_one_run", "audit_dirichlet_leakage"):
        from dpnoise.audit import training

        return getattr(training, name)
    raise AttributeError(name)
