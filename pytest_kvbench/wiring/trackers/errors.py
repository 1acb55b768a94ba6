"""What goes wrong with a tracker, said in one line: at startup a usage error (before any model loads), mid-run a
line in the summary (the benchmark goes on without the tracker)."""

from __future__ import annotations


class TrackerSetupError(ValueError):
    """A tracker that cannot be used: its extra is missing, its store does not answer (one line)."""


def one_line(error: BaseException) -> str:
    """An exception's message on one line, cut to 300 characters (a server's HTML error page is not a line)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
