"""Privacy-loss-distribution (PLD) accounting with proven discretisation and round-off bounds.

* :mod:`~dpnoise.accounting.pld.gdp` -- Gaussian-DP domination of L2-clipped Laplace noise
  (Lap2), which lets the Poisson-sampled Gaussian PLD bound Lap2;
* :mod:`~dpnoise.accounting.pld.dirichlet` -- the PLD of the two-class Dirichlet mechanism's
  vertex pair, which dominates every pair of two-class inputs (the route ``dirichlet-pld``, for
  events that record two classes);
* :mod:`~dpnoise.accounting.pld.single_step` -- one Poisson-sampled Gaussian or Laplace step as a
  pessimistic connect-the-dots PMF with a proven tail-sum error;
* :mod:`~dpnoise.accounting.pld.tilted` and :mod:`~dpnoise.accounting.pld.roundoff` -- the
  composition by exponentially tilted FFTs and the bound on its round-off;
* :mod:`~dpnoise.accounting.pld.bounded` -- a composed PLD's epsilon(delta) and delta(epsilon);
* :mod:`~dpnoise.accounting.pld.distribution` -- the routes of our events: grids, validation,
  caching; epsilon(delta) and delta(epsilon).  dp_accounting (Google) is a test-only cross-check.
"""
