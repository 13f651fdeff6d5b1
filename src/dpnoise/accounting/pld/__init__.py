"""Privacy-loss-distribution (PLD) accounting, through dp_accounting's PLD implementation.

* :mod:`~dpnoise.accounting.pld.gdp` -- Gaussian-DP domination of L2-clipped Laplace noise
  (Lap2), which lets the Poisson-sampled Gaussian PLD bound Lap2;
* :mod:`~dpnoise.accounting.pld.dirichlet` -- the PLD of the two-class Dirichlet mechanism's
  vertex pair, which dominates every pair of two-class inputs (the route ``dirichlet-pld``, for
  events that record two classes);
* :mod:`~dpnoise.accounting.pld.distribution` -- our events as dp_accounting PLDs with
  pessimistic rounding, validated, composed and cached; epsilon(delta) and delta(epsilon).
"""
