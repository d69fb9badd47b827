"""The trainer's one domain error.

``UsageError`` is for user mistakes (bad config, missing dataset, bad environment). It is caught
once, in ``train.__main__``, which prints its message as one line on stderr and exits with status
2. Programmer invariants use ``assert``; everything else propagates with a traceback.
"""


class UsageError(ValueError):
    """A mistake the user can fix; the message says what, where and what to do next."""


class InjectedFailure(RuntimeError):
    """Raised by the ``debug.stop_after_*`` options to simulate a crash right after a
    checkpoint; ``train.__main__`` turns it into exit status 3."""
