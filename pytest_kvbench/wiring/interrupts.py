"""Ctrl-C (SIGINT) during a benchmark run: honoured at once, and never half-way through writing the results.

An interrupt may land anywhere: before the first item, inside an item, between items, in xdist's teardown of
its workers after every item finished, or while the controller writes run.json and RESULTS.md. Whatever it hits,
the run's files must agree with records.jsonl (docs/resilience.md). Three things make that so:

- ``honour_sigint``: a run started as a background job of a script (``pytest ... &`` in a non-interactive shell)
  inherits SIGINT *ignored*, and Python then never raises KeyboardInterrupt: ``kill -INT`` was seen doing
  nothing for minutes inside a long kvzip item (torch and the engine catch nothing; the signal never reached
  Python). A process that runs benchmark items restores Python's handler, so SIGINT stops it.
- ``honour_sigterm``: the controller takes SIGTERM (``kill``, ``timeout``, a batch system's end of job) as a
  Ctrl-C, so its xdist workers are shut down and the run written, instead of dying with its workers left running.
- ``InterruptShield``: from the start of the session's end (xdist's teardown of its workers, then the writing)
  until pytest unconfigures, a first SIGINT is only noted (a second one goes through), so the workers stop
  cleanly and the files are written whole; the session then ends as interrupted, with pytest's usual short note.
- The plugin's ``pytest_sessionfinish`` wraps xdist's teardown and keeps a KeyboardInterrupt raised there
  (run_plugin.py), so that the run's files are still written: a Ctrl-C there used to give pytest's 84-line
  traceback and no run.json.
"""

from __future__ import annotations

import signal
import threading

import pytest


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _sigterm_as_sigint(signum, frame) -> None:
    """SIGTERM handled as the SIGINT handler of the moment handles it: KeyboardInterrupt, or only noted while the
    InterruptShield holds it off."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def honour_sigterm() -> bool:
    """The controller stops on SIGTERM as on Ctrl-C, where SIGTERM still has its default action (killing the
    process at once); True if it now does. Killed outright, it left its xdist workers running their items to the
    end with no one to report to, each then printing PluggyTeardownRaisedWarning ("cannot send") on exit, and the
    run unwritten; stopped as on Ctrl-C, xdist shuts the workers down and the run is written as interrupted."""
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    return True


def honour_sigint() -> bool:
    """Restore Python's KeyboardInterrupt handler where SIGINT was inherited ignored; True if it was."""
    if not _in_main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


class InterruptShield:
    """Hold a SIGINT off between ``start()`` and ``stop()``: the first one is noted (``interrupted``), a
    second one raises KeyboardInterrupt as usual (a process stuck on a dead filesystem can still be stopped).
    Outside the main thread, or where SIGINT is ignored, it does nothing."""

    def __init__(self) -> None:
        self.interrupted: pytest.ExceptionInfo | None = None
        self.session: pytest.Session | None = None  # whose exit status an interrupt held off sets
        self._previous = None
        self._active = False

    def start(self, session: pytest.Session) -> None:
        self.session = session
        if self._active or not _in_main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if previous == signal.SIG_IGN:
            return
        self._previous = previous
        signal.signal(signal.SIGINT, self._note)
        self._active = True

    def note(self, excinfo: pytest.ExceptionInfo) -> None:
        """Remember an interrupt caught elsewhere (in xdist's teardown)."""
        if self.interrupted is None:
            self.interrupted = excinfo

    def _note(self, signum, frame) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            self.note(pytest.ExceptionInfo.from_current())
        signal.signal(signal.SIGINT, self._previous)  # the second Ctrl-C is not held off

    def stop(self) -> pytest.ExceptionInfo | None:
        """End the shield; the interrupt it held off (or was told of), if any."""
        if self._active:
            if signal.getsignal(signal.SIGINT) == self._note:
                signal.signal(signal.SIGINT, self._previous)
            self._active = False
        return self.interrupted
