"""The errors that end a run with one line (exit status 2), not a traceback, and the one way each is said."""
import re
import sys

from distrain.common.messages import error_line


class ConfigError(Exception):
    """Bad input: the message is one line naming the problem and the fix."""


class Diverged(Exception):
    """The loss became NaN or infinite: training stops there, since going on cannot help."""


FINAL = (ConfigError, Diverged)  # one line and exit status 2: a restart would only repeat them


class PeerLost(Exception):
    """A task of the cluster died or stopped answering mid-training: one line, exit status 1 (a
    restart from the latest checkpoint can help, unlike a ConfigError). hung: it stopped answering
    (alive, so a launcher watching it does not see it end)."""

    def __init__(self, message: str, hung: bool = False):
        super().__init__(message)
        self.hung = hung


def print_error(message: str) -> None:
    """`error: MESSAGE` on stderr in one write. print() writes the text and its newline apart, and a
    line TensorFlow's threads log in between (a parameter-server coordinator logs each failed call
    while this line is printed) would join it, hiding it among their output."""
    sys.stderr.write(error_line(message) + "\n")
    sys.stderr.flush()


def fail(exc: Exception) -> int:
    """Say an error that ends a command in one line (`error: ...`); returns the exit status for it, 2."""
    print_error(str(exc))
    return 2


def first_line(text: str, limit: int | None = 200) -> str:
    """What one line can say of an error's text: its first line without TensorFlow's {{function_node ...}}
    tags, cut to `limit` characters."""
    lines = re.sub(r"\{\{[^}]*\}\}", "", text).strip().splitlines()
    return lines[0][:limit] if lines else ""
