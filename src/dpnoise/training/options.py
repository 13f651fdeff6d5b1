"""How an option of a private training run is declared once: :class:`Option`, the metadata of a dataclass
field (:func:`option`) that gives its command-line flag, help, check and choices; and how a check across
fields is declared once: :class:`Rule`, which every entry point runs, naming the fields its own way.

The sections of a :class:`~dpnoise.training.config.TrainingConfig` declare their fields with it, among them
the options of ``make_private`` themselves (:class:`~dpnoise.training.privacy_plan.PrivacyOptions`,
:class:`~dpnoise.training.execution.ExecutionOptions`); the command line builds its parser from them and
:func:`~dpnoise.training.config.check_config` its per-field checks.  This module imports no torch.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Optional, Union


@dataclass(frozen=True)
class Option:
    """How a configuration field is given on the command line and checked (its :func:`option` metadata).

    ``check`` is the name of a :mod:`dpnoise.checks` function and its extra arguments, run as
    ``check(name, value, *extra)`` by :func:`~dpnoise.training.config.check_config` and, on the options given,
    by the command line before any work.  ``choices`` are the values accepted; where they come from a
    registry that imports torch, ``registry`` names it (``"dpnoise.data.DATASETS"``): the registry is the
    truth, checked by :func:`~dpnoise.training.preparation.check_against_registries`, and ``choices`` its
    torch-free copy for the command line (a test checks that they agree).  ``help`` may name
    ``{mechanisms}``, ``{noise_units}`` and ``{accountants}``, which the command line fills in from the
    mechanism and accountant registries.  ``path``, ``type`` and ``default`` are those of the declaring
    field (:data:`~dpnoise.training.config.OPTIONS`).
    """

    flag: str
    help: str
    #: the heading the command line lists the flag under (one of :data:`OPTION_GROUPS`)
    group: str
    check: tuple[Any, ...] = ()
    #: the values, or a function giving them when the command line is built (a registry that grows)
    choices: Union[tuple[str, ...], Callable[[], tuple[str, ...]], None] = None
    registry: Optional[str] = None
    metavar: Optional[str] = None
    #: the command line needs the flag (a field without a default may instead come from a ``--recipe``)
    required: bool = False
    #: a training run needs a value although the field's class has a default (None: ``PrivacyOptions.epochs``,
    #: which ``make_private`` can do without): in a configuration the field has no default
    needed: bool = False
    #: the declaring field's dotted path, its type (``Optional`` removed) and its default in a configuration
    #: (None: "not given"; ``MISSING``: none, a value must be given)
    path: str = ""
    type: Any = None
    default: Any = None

    def allowed(self) -> Optional[tuple[str, ...]]:
        """The accepted values now (None: any value that passes the check)."""
        return self.choices() if callable(self.choices) else self.choices


def option(default: Any = MISSING, **declared: Any) -> Any:
    """A dataclass field whose metadata is ``Option(**declared)`` (no ``default``: a required field)."""
    return field(default=default, metadata={"option": Option(**declared)})


WHAT, PRIVACY, OPTIMISATION, RUN = "what to train", "privacy", "optimisation", "run"
#: the headings the command line lists the options under (:attr:`Option.group`), in this order
OPTION_GROUPS = (WHAT, PRIVACY, OPTIMISATION, RUN)


#: a field's value by its name; how an entry point names a field in a message
FieldValue = Callable[[str], Any]
Naming = Callable[[str], str]


@dataclass(frozen=True)
class Rule:
    """A check across fields: ``refuses(value_at)`` is True where the fields' values break it, and
    ``message(name, value_at)`` says why, calling each field ``name(field)``.  Declared once beside the
    fields (:data:`~dpnoise.training.privacy_plan.PRIVACY_RULES`, :data:`~dpnoise.training.config.RULES`)
    and run by every entry point: ``make_private``'s options (``noise_multiplier=``), a training
    configuration (``privacy.noise``), the command line (``--noise``)."""

    refuses: Callable[[FieldValue], bool]
    message: Callable[[Naming, FieldValue], str]

    def within(self, section: str) -> "Rule":
        """The same rule on the fields of a configuration's ``section`` (``"privacy"``: ``privacy.noise``)."""
        def inside(value_at: FieldValue) -> FieldValue:
            return lambda name: value_at(f"{section}.{name}")

        return Rule(lambda value_at: self.refuses(inside(value_at)),
                    lambda name, value_at: self.message(lambda field: name(f"{section}.{field}"), inside(value_at)))


def broken_rule(rules: "tuple[Rule, ...]", value_at: FieldValue) -> Optional[Rule]:
    """The first of ``rules`` the values break (None: none)."""
    return next((rule for rule in rules if rule.refuses(value_at)), None)

