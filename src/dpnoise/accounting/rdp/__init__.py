"""Renyi-DP accounting: one module per mechanism, plus subsampling and conversion.

Order convention: every curve is indexed by the Renyi order ``a > 1`` and holds the Renyi
divergence ``D_a``.  A *log-moment* ``M(a) = (a - 1) D_a = log E_Q[(P/Q)^a]``.  The papers'
moments-accountant function is ``alpha(lam) = lam * D_{lam+1} = M(lam + 1)``.
"""

from dpnoise.accounting.rdp.conversion import delta_from_rdp, epsilon_from_rdp
from dpnoise.accounting.rdp.orders import DEFAULT_ORDERS, INTEGER_ORDERS

__all__ = ["DEFAULT_ORDERS", "INTEGER_ORDERS", "epsilon_from_rdp", "delta_from_rdp"]
