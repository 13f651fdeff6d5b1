"""A run's step accounting, which is all the private optimizers see of the privacy engine.

A :class:`StepLedger` holds the DP event of one training step (built once by ``make_private``), the
accountants that compose it, the step counter and the step budget.  The optimizers are given the
ledger, not the engine: before a step they ask :meth:`StepLedger.admit_step` (refused past the
budget), after noising it they call :meth:`StepLedger.record_step`.  The engine reads its counter,
budget and epsilons from the same ledger and accountants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Optional
import warnings

from dpnoise.accounting import PrivacyAccountant, UnsoundAccountantWarning
from dpnoise.accounting.events import DpEvent
from dpnoise.training.errors import PrivacyBudgetExceededError

BudgetPolicy = Literal["raise", "stop"]


@dataclass(eq=False)
class StepLedger:
    """The steps of one run: the event every accountant composes per step, and the budget."""

    #: the DP event of one training step
    step_event: DpEvent
    #: every accountant of the run by name (the engine's own dictionary)
    accountants: Mapping[str, PrivacyAccountant]
    #: the most steps within the budget (None: no budget)
    max_steps: Optional[int] = None
    #: a step past the budget raises :class:`PrivacyBudgetExceededError` ("raise") or is skipped ("stop")
    policy: BudgetPolicy = "raise"
    #: the budget in words, for the refusal (e.g. "epsilon=2.0 (delta=1e-05, accountant gaussian)")
    budget: str = ""
    #: steps recorded so far (the distributed optimizers check that every rank holds the same)
    steps: int = 0
    #: a step was refused (or skipped) for the budget
    budget_exhausted: bool = False

    def admit_step(self) -> bool:
        """True if one more step fits the budget; otherwise skip it (False, ``policy="stop"``) or raise.

        In a process group, the step's all-reduce checks that all ranks are at the same step (the
        distributed optimizers pass :attr:`steps` to ``RankGroup.all_reduce_sum``), so that their
        accountants hold the same ledger and the budget, the same on every rank, stops them all at
        the same step.
        """
        if self.max_steps is None or self.steps < self.max_steps:
            return True
        self.budget_exhausted = True
        if self.policy == "stop":
            return False
        raise PrivacyBudgetExceededError(f"step {self.steps + 1} would exceed the privacy budget {self.budget}: "
                                         f"at most {self.max_steps} steps")

    def record_step(self) -> None:
        """Compose one step (:attr:`step_event`) into every accountant."""
        for accountant in self.accountants.values():
            accountant.compose(self.step_event)
        self.steps += 1

    def account_later_steps(self, steps_taken: int) -> None:
        """Move the counter and every accountant on to ``steps_taken`` (>= :attr:`steps`): steps a run took
        that the state it was restored from does not hold."""
        for accountant in self.accountants.values():
            accountant.compose(self.step_event, steps_taken - self.steps)
        self.steps = steps_taken

    def epsilon_by_accountant(self, delta: float, primary: str) -> dict[str, float]:
        """Epsilon so far at ``delta`` under every accountant.  An unsound accountant warns only when it is
        the ``primary`` one, which the user chose; beside it, its value comes without a warning."""
        by_accountant = {}
        for name, accountant in self.accountants.items():
            with warnings.catch_warnings():
                if name != primary:
                    warnings.simplefilter("ignore", UnsoundAccountantWarning)
                by_accountant[name] = accountant.get_epsilon(delta)
        return by_accountant
