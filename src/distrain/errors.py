"""The errors that end a run with one line (exit status 2), not a traceback."""


class ConfigError(Exception):
    """Bad input: the message is one line naming the problem and the fix."""


class Diverged(ConfigError):
    """The loss became NaN or infinite: training stops there, since going on cannot help."""


class PeerLost(Exception):
    """A task of the cluster died or stopped answering mid-training: one line, exit status 1 (a
    restart from the latest checkpoint can help, unlike a ConfigError)."""
