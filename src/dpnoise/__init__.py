"""dpnoise: differentially private deep learning beyond plain Gaussian DP-SGD.

* :mod:`dpnoise.accounting` -- pure NumPy/SciPy privacy accounting (no torch).
* :mod:`dpnoise.mechanisms`, :mod:`dpnoise.training` -- torch mechanisms and the private trainer.
* :mod:`dpnoise.audit` -- lower bounds and empirical audits of every claimed epsilon.

Torch-dependent names (``make_private``, ``PrivacyEngine``) are imported lazily so that
``import dpnoise.accounting`` works on a machine without torch.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {"make_private": "dpnoise.training", "PrivacyEngine": "dpnoise.training"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpnoise' has no attribute {name!r}")
