"""A child process started the way a terminal starts a foreground command, for the Ctrl-C tests."""

from __future__ import annotations

import signal


def foreground() -> None:
    """Popen preexec_fn: SIGINT at its default, as in a terminal's foreground job.

    A job that a non-interactive shell starts in the background (CI does) inherits SIGINT ignored, an
    ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt handler:
    the program, rightly, never sees Ctrl-C. These tests are about the program under a terminal.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
