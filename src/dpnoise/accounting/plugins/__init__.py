"""The built-in mechanisms, one module each, every one registered by one
:func:`~dpnoise.accounting.plugin.register_plugin` call when :mod:`dpnoise.accounting` is imported.

* :mod:`.gaussian` -- DP-SGD (L2 clipping, Gaussian noise);
* :mod:`.laplace_l1` -- Laplace DP-SGD with L1 clipping;
* :mod:`.lap2` -- Lap2 (L2 clipping, i.i.d. Laplace noise; the sound and the published accountants);
* :mod:`.dirichlet` -- the Dirichlet output mechanism (inputs private, labels public);
* :mod:`.penultimate_gaussian` -- Gaussian noise on clipped penultimate activations (baseline).
"""

# in this order: the command line lists the mechanisms so
from dpnoise.accounting.plugins import gaussian, laplace_l1, lap2, dirichlet, penultimate_gaussian  # noqa: I001

__all__ = ["gaussian", "laplace_l1", "lap2", "dirichlet", "penultimate_gaussian"]
