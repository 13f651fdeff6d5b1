"""kymatio's 2-D scattering transform (torch front end), imported without kymatio's 3-D code.

``import kymatio.torch`` loads the 1-D, 2-D and 3-D torch front ends, and the 3-D filter bank
imports ``scipy.special.sph_harm``, which SciPy 1.17 removed: with kymatio 0.3.0 that import fails.
The 2-D torch front end, ``kymatio.scattering2d.frontend.torch_frontend``, needs only NumPy and
torch, so it is imported directly.  (kymatio's package ``__init__`` still imports the light entry
point ``kymatio.scattering3d``, which does not load the 3-D filter bank.)
"""

from __future__ import annotations

import importlib
import importlib.metadata

from torch import nn

from dpnoise.models.errors import InvalidModelError, ModelNotAvailableError

KYMATIO_INSTALL = "pip install 'kymatio>=0.3,<0.4'"
#: the module that holds kymatio's 2-D torch scattering class, ``ScatteringTorch2D``
TORCH_FRONTEND_2D = "kymatio.scattering2d.frontend.torch_frontend"


def scattering2d_class() -> type[nn.Module]:
    """kymatio's ``ScatteringTorch2D`` (what ``kymatio.torch.Scattering2D`` names), 3-D code not loaded."""
    try:
        frontend = importlib.import_module(TORCH_FRONTEND_2D)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "kymatio":
            raise
        raise ModelNotAvailableError("scatternet", "Python package kymatio", KYMATIO_INSTALL) from error
    return frontend.ScatteringTorch2D


def kymatio_version() -> str:
    """The installed kymatio's version (part of the feature cache's salt)."""
    return importlib.metadata.version("kymatio")


def scattering2d(shape: tuple[int, int], J: int, L: int = 8) -> nn.Module:
    """A frozen 2-D scattering transform of order 2 for images of side ``shape`` (height, width).

    Input ``(..., H, W)``; output ``(..., 1 + J L + L^2 J (J - 1) / 2, H // 2^J, W // 2^J)``
    (81 coefficients for J = 2, L = 8).  It has no trainable parameters (its filters are buffers).
    """
    if min(shape) < 2**J:
        raise InvalidModelError(f"the scattering transform with J={J} needs images of side >= {2**J}, got {shape}")
    return scattering2d_class()(J=J, shape=tuple(shape), L=L).requires_grad_(False).eval()
