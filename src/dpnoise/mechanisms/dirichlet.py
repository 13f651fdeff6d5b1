"""The Dirichlet output mechanism (Dirichlet-mechanism paper, Algorithm 1; docs/theory/dirichlet.md §4).

For each example in the batch the model's softmax output s = softmax(z) is replaced by a sample
p~ ~ Dir(r s + alpha 1_d); the training loss is the NLL of the public label on p~, -log p~_y.

Numerics: p~ is drawn through Gamma variables in log space.  A Gamma(a) variable equals
Gamma(a + 1) * U^(1/a) with U ~ Uniform(0, 1], so

    log G = log Gamma(a + 1) + log(U) / a,        log p~ = log G - logsumexp(log G),

which stays finite in float32 even for tiny concentrations (where Gamma(a) itself underflows to 0).
Both terms are reparameterised (torch's Gamma sampler has a pathwise gradient), so gradients flow
from the loss to the logits.

Effective learning rate (docs/theory/dirichlet.md §4): E[d(-log p~_y)/dz_j] = kappa (s_j - 1[j = y]) with
kappa = r s_y psi'(r s_y + alpha); the paper sets gamma = gamma_eff / kappa(s_y = 0.9).
"""

from __future__ import annotations

from typing import Optional

import torch
from scipy.special import polygamma
from torch import nn
from torch.nn import functional as F

from dpnoise.accounting.events import DirichletEvent
from dpnoise.accounting.validation import check_positive
from dpnoise.mechanisms.errors import InvalidMechanismError
from dpnoise.mechanisms.registry import implement_mechanism
from dpnoise.prepared import PreparedForAccelerate

#: The Dirichlet-mechanism paper's reference value of the true-class probability for the effective learning rate.
KAPPA_REFERENCE_PROBABILITY = 0.9


def log_gamma_rsample(concentration: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """log of a Gamma(concentration, 1) sample, reparameterised and finite for small shapes."""
    boosted = torch._standard_gamma(concentration + 1.0, generator=generator)
    uniform = 1.0 - torch.rand(concentration.shape, generator=generator, dtype=concentration.dtype,
                               device=concentration.device)
    return torch.log(boosted) + torch.log(uniform) / concentration


def dirichlet_log_sample(
    logits: torch.Tensor, r: float, alpha: float, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """log p~ for p~ ~ Dir(r softmax(logits) + alpha), row-wise; differentiable in ``logits``."""
    concentration = r * torch.softmax(logits, dim=-1) + alpha
    log_gamma = log_gamma_rsample(concentration, generator)
    return log_gamma - torch.logsumexp(log_gamma, dim=-1, keepdim=True)


def dirichlet_nll(
    logits: torch.Tensor,
    targets: torch.Tensor,
    r: float,
    alpha: float,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Mean over the batch of -log p~_y (the loss of Algorithm 1)."""
    return F.nll_loss(dirichlet_log_sample(logits, r, alpha, generator), targets)


def kappa(true_class_probability: float, r: float, alpha: float) -> float:
    """Gradient attenuation kappa(s_y; r, alpha) = r s_y psi'(r s_y + alpha) (docs/theory/dirichlet.md §4)."""
    scaled = r * true_class_probability
    return float(scaled * polygamma(1, scaled + alpha))


def dirichlet_learning_rate(
    target_effective_lr: float,
    r: float,
    alpha: float,
    true_class_probability: float = KAPPA_REFERENCE_PROBABILITY,
) -> float:
    """Learning rate gamma with gamma * kappa(s_y) equal to ``target_effective_lr`` (the Dirichlet-mechanism paper's heuristic)."""
    check_positive("effective learning rate", target_effective_lr)
    return target_effective_lr / kappa(true_class_probability, r, alpha)


class DirichletOutput(nn.Module):
    """Wraps a classifier so that in training mode it returns log p~ (Dirichlet mechanism).

    In training mode ``forward`` returns ``log p~`` (rows sum to one in probability space), so both
    ``F.nll_loss`` and ``F.cross_entropy`` on the output compute -log p~_y (``log_softmax`` leaves a
    normalised log-probability vector unchanged).  In eval mode it returns ``log_softmax(logits)``:
    evaluation is not part of the private mechanism.
    """

    #: accelerate's prepare() leaves the private module unwrapped (:mod:`dpnoise.prepared`)
    _is_accelerate_prepared = PreparedForAccelerate()

    def __init__(self, module: nn.Module, r: float, alpha: float, generator: Optional[torch.Generator] = None,
                 num_classes: Optional[int] = None):
        super().__init__()
        check_positive("Dirichlet scale r", r)
        check_positive("Dirichlet offset alpha", alpha)
        self.module = module
        self.r = r
        self.alpha = alpha
        self.generator = generator
        #: the number of classes the accountants were told (None: not told); a release of another size is refused
        self.num_classes = num_classes

    def forward(self, *args, **kwargs) -> torch.Tensor:
        logits = self.module(*args, **kwargs)
        if not self.training:
            return torch.log_softmax(logits, dim=-1)
        if self.num_classes is not None and logits.shape[-1] != self.num_classes:
            raise InvalidMechanismError(f"the model's outputs have {logits.shape[-1]} classes, but the accountants "
                                        f"account releases of {self.num_classes} (num_classes)")
        return dirichlet_log_sample(logits, self.r, self.alpha, self.generator)


def wrap_dirichlet(module: nn.Module, event: DirichletEvent, *, clip: float, generator) -> nn.Module:
    """The Dirichlet mechanism's torch side: ``module``'s training-mode outputs released as samples of the
    event's law (of its number of classes, where the accountants were told)."""
    del clip  # softmax outputs are bounded by construction
    return DirichletOutput(module, r=event.r, alpha=event.alpha, generator=generator, num_classes=event.num_classes)


implement_mechanism("dirichlet", wrap_module=wrap_dirichlet)
