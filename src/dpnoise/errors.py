"""The package's error base class.

Every error that dpnoise raises on purpose (invalid input, unreachable targets, budgets,
checkpoints, missing data) derives from :class:`DpnoiseError`, so that callers, and the command
line, can tell them from bugs: the CLI turns a ``DpnoiseError`` into exit status 2 with one line,
and lets anything else show its traceback.
"""


class DpnoiseError(Exception):
    """Base class of the errors dpnoise raises deliberately (the message says what to change)."""
