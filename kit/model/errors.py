"""The two ways a command can fail, and their exit codes.

Exit codes are a contract people script against: 0 ok, 1 a check failed
(verification, gate, comparability, conformance), 2 bad input or usage.
"""


class KitError(Exception):
    """Base of every error the CLI turns into a one-line message instead of a traceback."""

    exit_code = 2


class BadInput(KitError):
    """The input cannot be used: a missing file, malformed JSON, an unknown arm, a bad flag value.

    The message names the file, JSON pointer or flag and says what would be accepted.
    """

    exit_code = 2


class CheckFailed(KitError):
    """The input was readable, and a check over it failed (verification, gate, comparison)."""

    exit_code = 1
