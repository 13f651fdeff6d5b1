"""The package's error base class.

Every error that dpnoise raises on purpose (invalid input, unreachable targets, budgets,
checkpoints, missing data) derives from :class:`DpnoiseError`, so that callers, and the command
line, can tell them from bugs: the CLI turns a ``DpnoiseError`` into exit status 2 with one line,
and lets anything else show its traceback.

:class:`ProcessGroupLostError` marks the one kind after which the process cannot go on: it lost the
other processes of a distributed run, and the command line ends it at once after its error line.
"""


class DpnoiseError(Exception):
    """Base class of the errors dpnoise raises deliberately (the message says what to change)."""


class ProcessGroupLostError(DpnoiseError):
    """A collective of a distributed run failed: another process died or stalled.

    The process group is then unusable, and so is this process: the communication library's threads
    may abort the interpreter's normal shutdown (``std::terminate``).  The ``dpnoise`` command line
    prints the error line, flushes its output and ends the process with status 2 without that
    shutdown; a library caller should end its process too, not train on.
    """
