"""Descriptions and warnings that several built-in mechanisms' accountants share."""

from __future__ import annotations

from dpnoise.accounting.registry import AccountantSpec

PLD_NOTE = "privacy loss distribution with pessimistic (connect-the-dots) rounding, arXiv 2207.04380"


def add_remove_reading(name: str, mechanism: str, default: str, example: str = "") -> str:
    """The warning of an output mechanism's accountant that reads its subsampling as add/remove."""
    return (f"{name} applies an add/remove subsampling bound to the {mechanism} mechanism's replace-one base "
            "bound, as the Dirichlet paper's Theorem 10 does: it is NOT a valid bound under replace-one "
            f"adjacency, where each sampled example's output is released with it{example} "
            f"(docs/theory/dirichlet.md, pitfall \"Reading of Theorem 10\"). Use '{default}' for a guarantee.")


def pld_and_rdp(mechanism: str, pld: str, rdp: str) -> tuple[AccountantSpec, ...]:
    """A Gaussian/Laplace mechanism's PLD and RDP routes and its default accountant, min(PLD, RDP)."""
    return (
        AccountantSpec(f"{mechanism}-pld", mechanism, True, f"{pld}: {PLD_NOTE}.", kind="pld"),
        AccountantSpec(f"{mechanism}-rdp", mechanism, True, rdp),
        AccountantSpec(mechanism, mechanism, True,
                       f"The smaller of {mechanism}-pld (primary) and {mechanism}-rdp, per delta (both sound).",
                       kind="minimum", routes=(f"{mechanism}-pld", f"{mechanism}-rdp")),
    )
