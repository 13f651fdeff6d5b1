"""``dpnoise audit``: check every privacy claim against lower bounds (see docs/AUDITS.md)."""

from __future__ import annotations

import argparse
from typing import Any

from dpnoise import checks
from dpnoise.accounting.mechanisms import MECHANISMS, option_fields
from dpnoise.cli.common import add_mechanism_option_flags, mechanism_option_values

GRADIENT_MECHANISMS = [name for name, spec in sorted(MECHANISMS.items()) if spec.perturbs == "gradients"]
#: --grid of ``audit bound``: the coarse k scan uses grid / 8 points, and 2**26 points already take
#: gigabytes in the FFT composition
GRID_RANGE = (64, 1 << 26)
#: ``audit sampler`` holds --trials x --dim noise draws (float64) several times in memory
MAX_SAMPLER_DRAWS = 10**8
#: ``audit training`` holds --canaries^2 x 2 gradient entries (float64)
MAX_CANARIES = 10_000


def _common(p: argparse.ArgumentParser, statistical: bool) -> None:
    p.add_argument("--delta", type=float, default=1e-5, help="target delta in (0, 1); default 1e-5")
    if statistical:
        p.add_argument("--confidence", type=float, default=0.95,
                       help="confidence level of the statistical lower bound; default 0.95")
        p.add_argument("--seed", type=int, default=0, help="random seed; default 0")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit", help="audit privacy claims: exact lower bounds and empirical attacks",
        description="Compare what an accountant claims (claimed_epsilon) with a lower bound on the "
        "true epsilon (lower_bound_epsilon). consistent is false when the lower bound exceeds the "
        "claim, i.e. the claim is proven wrong (bound) or refuted at the stated confidence.",
    )
    kinds = p.add_subparsers(dest="audit", required=True, metavar="AUDIT")

    b = kinds.add_parser("bound", help="exact PLD lower bound vs an accountant's epsilon",
                         description="Exact (discretised, rounded down) privacy-loss-distribution "
                         "lower bound of the Poisson-subsampled mechanism composed over T steps for "
                         "a feasible worst-case pair, versus the accountant's epsilon.")
    b.add_argument("--mechanism", required=True, metavar="ACCOUNTANT",
                   help="accountant whose claim is checked, any of `dpnoise account`'s (e.g. gaussian, "
                   "laplace-l1, lap2, lap2-paper: the Lap2 paper's published one, dirichlet)")
    b.add_argument("--noise", type=float, required=True,
                   help="sigma (gaussian, multiplier of C), absolute Laplace scale b (lap2*, "
                   "laplace-l1) or Dirichlet scale r (dirichlet*)")
    b.add_argument("--clip", type=float, default=1.0, help="clipping norm C; default 1")
    b.add_argument("--sample-rate", type=float, required=True, help="Poisson sampling rate q in (0, 1]")
    b.add_argument("--steps", type=int, required=True, help="number of steps T")
    b.add_argument("--params", type=int, help="number of trained parameters n (lap2*: k grid up to n)")
    add_mechanism_option_flags(b)
    b.add_argument("--k", type=str,
                   help="lap2 only: comma-separated support sizes k of the shift (C/sqrt(k))(1,..,1,0,..); "
                   "default: 12 geometric points in 1..n, the worst refined")
    b.add_argument("--grid", type=int, default=1 << 21,
                   help="grid points of the per-step log-likelihood-ratio law; larger = tighter, slower")
    b.add_argument("--loss-step", type=float,
                   help="privacy-loss grid step of the composition; default 0.02/T (rounding costs <= ~0.02)")
    _common(b, statistical=False)
    b.set_defaults(func=run_bound)

    s = kinds.add_parser("sampler", help="empirical audit of the clipping + noise sampler",
                         description="Run the library's clipping and noise sampler on a canary pair "
                         "(one unsampled step), test with the likelihood ratio, and bound epsilon "
                         "from FPR/FNR with Clopper-Pearson confidence.")
    s.add_argument("--mechanism", required=True, choices=GRADIENT_MECHANISMS, help="gradient mechanism")
    s.add_argument("--noise", type=float, required=True, help="sigma (gaussian) or Laplace scale b")
    s.add_argument("--clip", type=float, default=1.0, help="clipping norm C; default 1")
    s.add_argument("--dim", type=int, default=16, help="gradient dimension (lap2: the k of the shift); default 16")
    s.add_argument("--trials", type=int, default=200_000, help="mechanism runs per side; default 200000")
    _common(s, statistical=True)
    s.set_defaults(func=run_sampler)

    t = kinds.add_parser("training", help="one-run canary audit of DP-SGD training (Steinke et al. 2023)",
                         description="Train a small softmax regression with the library's DP optimizer "
                         "and white-box Dirac gradient canaries, each included w.p. 1/2; guess "
                         "membership from the iterates and bound epsilon from the correct guesses.")
    t.add_argument("--mechanism", default="gaussian", choices=GRADIENT_MECHANISMS, help="default gaussian")
    t.add_argument("--noise", type=float, default=1.0, help="sigma or Laplace scale b; default 1")
    t.add_argument("--clip", type=float, default=1.0, help="clipping norm C; default 1")
    t.add_argument("--sample-rate", type=float, default=0.2, help="Poisson rate q; default 0.2")
    t.add_argument("--steps", type=int, default=20, help="training steps T; default 20")
    t.add_argument("--canaries", type=int, default=1000, help="number of canaries m; default 1000")
    t.add_argument("--guesses", type=int, default=200, help="guesses r (half 'in', half 'out'); default 200")
    _common(t, statistical=True)
    t.set_defaults(func=run_training)

    d = kinds.add_parser("dirichlet-leakage", help="membership test on a Dirichlet-mechanism update",
                         description="docs/theory/dirichlet.md §5: an adversary who knows the other batch "
                         "members tests the update's component outside their feature span. The "
                         "Dirichlet epsilon covers the released outputs only, not the parameters.")
    d.add_argument("--noise", type=float, default=0.1, help="Dirichlet scale r; default 0.1")
    d.add_argument("--alpha", type=float, default=1.0, help="Dirichlet offset alpha; default 1")
    d.add_argument("--batch", type=int, default=8, help="other batch members B (< --features); default 8")
    d.add_argument("--features", type=int, default=32, help="penultimate width; default 32")
    d.add_argument("--trials", type=int, default=400, help="updates per side; default 400")
    _common(d, statistical=True)
    d.set_defaults(func=run_dirichlet)


def _report(result: dict[str, Any], as_json: bool) -> int:
    from dpnoise.cli.common import emit

    keys = ["audit", "mechanism", "accountant", "claimed_epsilon", "lower_bound_epsilon", "confidence",
            "consistent", "worst_pair", "warning", "scope"]
    lines = [f"{k}: {result[k]}" for k in keys if result.get(k) is not None]
    emit(result, as_json, lines)
    return 0


def check_common(args: argparse.Namespace, statistical: bool) -> None:
    checks.check_delta("--delta", args.delta)
    if statistical:
        checks.fraction("--confidence", args.confidence, low_open=True)
        checks.seed("--seed", args.seed)


def parse_ks(text: str, params: int | None) -> list[int]:
    """--k: comma-separated support sizes, each in [1, --params]."""
    ks = []
    for item in text.split(","):
        try:
            k = int(item.strip())
        except ValueError:
            raise checks.InvalidParameterError(
                f"--k must be comma-separated integers, e.g. 1,16,256; got {text!r}") from None
        ks.append(checks.check_count("--k", k, 1))
    if params is not None and max(ks) > params:
        raise checks.InvalidParameterError(f"--k values must be <= --params ({params}), got {max(ks)}")
    return ks


def check_bound(args: argparse.Namespace) -> tuple[list[int] | None, Any]:
    """Check the options of ``audit bound``; return the parsed --k (None: the default grid) and the mechanism's
    options."""
    from dpnoise.accounting import ACCOUNTANTS

    if args.mechanism not in ACCOUNTANTS:
        raise checks.InvalidParameterError(
            f"--mechanism {args.mechanism!r} is not an accountant; choose from {', '.join(sorted(ACCOUNTANTS))}")
    checks.check_positive("--noise", args.noise)
    checks.check_positive("--clip", args.clip)
    checks.check_sample_rate("--sample-rate", args.sample_rate)
    checks.check_count("--steps", args.steps, 1)
    checks.optional(checks.params, "--params", args.params)
    checks.count_in("--grid", args.grid, *GRID_RANGE)
    checks.optional(checks.check_positive, "--loss-step", args.loss_step)
    check_common(args, statistical=False)
    ks = parse_ks(args.k, args.params) if args.k is not None else None
    spec = MECHANISMS[ACCOUNTANTS[args.mechanism].mechanism]
    if spec.needs_params and ks is None and args.params is None:
        raise checks.InvalidParameterError(f"--params (or --k) is required for --mechanism {args.mechanism}")
    options = spec.make_options(naming=lambda name: option_fields()[name].flag, **mechanism_option_values(args))
    return ks, options


def check_sampler(args: argparse.Namespace) -> None:
    checks.check_positive("--noise", args.noise)
    checks.check_positive("--clip", args.clip)
    checks.check_count("--dim", args.dim, 1)
    checks.check_count("--trials", args.trials, 2)  # half select the threshold, half test it
    if args.dim * args.trials > MAX_SAMPLER_DRAWS:
        raise checks.InvalidParameterError(
            f"--trials x --dim must be <= {MAX_SAMPLER_DRAWS:.0e} (memory), got {args.trials} x {args.dim}")
    check_common(args, statistical=True)


def check_training(args: argparse.Namespace) -> None:
    checks.check_positive("--noise", args.noise)
    checks.check_positive("--clip", args.clip)
    checks.check_sample_rate("--sample-rate", args.sample_rate)
    checks.check_count("--steps", args.steps, 1)
    checks.count_in("--canaries", args.canaries, 2, MAX_CANARIES)
    checks.count_in("--guesses", args.guesses, 2, args.canaries)
    if args.guesses % 2:
        raise checks.InvalidParameterError(f"--guesses must be even (half 'in', half 'out'), got {args.guesses}")
    check_common(args, statistical=True)


def check_dirichlet(args: argparse.Namespace) -> None:
    checks.check_positive("--noise", args.noise)
    checks.check_positive("--alpha", args.alpha)
    checks.check_count("--batch", args.batch, 1)
    checks.check_count("--features", args.features, 2)
    if args.batch >= args.features:
        raise checks.InvalidParameterError(
            f"--batch must be < --features (otherwise the others span everything), got {args.batch} >= {args.features}")
    checks.check_count("--trials", args.trials, 2)  # half select the threshold, half test it
    check_common(args, statistical=True)


def run_bound(args: argparse.Namespace) -> int:
    ks, options = check_bound(args)
    from dpnoise.audit.bound import audit_bound

    return _report(audit_bound(
        args.mechanism, args.noise, args.sample_rate, args.steps, args.delta, clip=args.clip,
        params=args.params, ks=ks, grid=args.grid, loss_step=args.loss_step, options=options,
    ), args.json)


def run_sampler(args: argparse.Namespace) -> int:
    check_sampler(args)
    from dpnoise.audit.sampler import audit_sampler

    return _report(audit_sampler(
        args.mechanism, args.noise, args.delta, clip=args.clip, dim=args.dim, trials=args.trials,
        confidence=args.confidence, seed=args.seed,
    ), args.json)


def run_training(args: argparse.Namespace) -> int:
    check_training(args)
    from dpnoise.audit.training import audit_one_run

    return _report(audit_one_run(
        args.mechanism, args.noise, clip=args.clip, sample_rate=args.sample_rate, steps=args.steps,
        canaries=args.canaries, guesses=args.guesses, delta=args.delta, confidence=args.confidence,
        seed=args.seed,
    ), args.json)


def run_dirichlet(args: argparse.Namespace) -> int:
    check_dirichlet(args)
    from dpnoise.audit.training import audit_dirichlet_leakage

    return _report(audit_dirichlet_leakage(
        r=args.noise, alpha=args.alpha, trials=args.trials, batch=args.batch, features=args.features,
        delta=args.delta, confidence=args.confidence, seed=args.seed,
    ), args.json)
