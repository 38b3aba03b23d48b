"""Signals as exceptions: SIGINT, SIGTERM and SIGHUP unwind the work of a command like Ctrl-C, and are never lost.

In:  a block of work (``signals_as_interrupts``), a few renames that must not stop half-way (``signals_held``).
Out: ``Interrupted`` raised where the process was (so ``finally`` blocks and staging cleanup run), delivered again
     every ``REDELIVER_S`` while something swallows it, and checked before an output is moved into place
     (``check_interrupted``); the command's exit line (``signal_name``). Used by the output folders
     (``seer_trt.contracts.outfolder``), the commands (``seer_trt.cli.common.run_main``) and seer-serve.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the process was, so ``finally`` blocks and staging cleanup run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(err: KeyboardInterrupt) -> tuple[str, int]:
    """("SIGTERM", 15) for an ``Interrupted``, ("SIGINT", 2) for a plain KeyboardInterrupt."""
    signum = getattr(err, "signum", signal.SIGINT)
    return signal.Signals(signum).name, int(signum)


REDELIVER_S = 0.5  # how soon a signal whose exception something swallowed is delivered again
_pending: list[int] = []  # the signal received inside signals_as_interrupts and not yet acted on (at most one)
_armed: list[bool] = []  # non-empty while a signals_as_interrupts block runs
_lock = threading.Lock()


def check_interrupted() -> None:
    """Raise ``Interrupted`` again if a signal arrived and the work went on anyway: an exception raised inside a
    ``__del__``, a weakref callback or a library's broad ``except`` is lost, and the work must not then complete.

    Raises:
        Interrupted: the pending signal.
    """
    if _pending:
        raise Interrupted(_pending[0])


def _redeliver() -> None:
    """Watchdog: while a signal stays pending, deliver it to the main thread again (``_thread.interrupt_main``)."""
    import _thread

    while _pending:
        time.sleep(REDELIVER_S)
        with _lock:
            if _pending:
                _thread.interrupt_main(_pending[0])


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` inside the block, and stay pending until the block ends.

    Python's default for SIGTERM ends the process at once, leaving staging folders behind; as an exception it
    unwinds like Ctrl-C, and whatever error ends the block after a signal came is reported as that signal (a library
    may catch the exception and raise its own). An exception can be swallowed where it lands (a ``__del__`` running
    at that moment prints "Exception ignored" and goes on), so the signal is delivered again every ``REDELIVER_S``
    until it has unwound the block, and ``replace_folder`` checks it before moving an output into place: a signal is
    never lost. Only the main thread can install handlers: elsewhere the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if not _armed:  # a redelivery landing while the block unwinds: it is being acted on already
            return
        if not _pending:
            _pending.append(signum)
            threading.Thread(target=_redeliver, name="seer-signal-redeliver", daemon=True).start()
        raise Interrupted(_pending[0])

    def ours(s: int) -> bool:  # a signal someone chose to ignore (nohup's SIGHUP) stays ignored
        current = signal.getsignal(s)
        default = signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL
        return current is default or getattr(current, "seer_default", False)  # the launcher's stands for it

    previous = {s: signal.signal(s, handler) for s in _SIGNALS if ours(s)}
    _armed.append(True)
    try:
        yield
        check_interrupted()  # the block finished although a signal came: it still counts
    except Exception as err:
        if _pending:  # a library turned the signal's exception into its own error (torch.export's tracer does)
            raise Interrupted(_pending[0]) from err
        raise
    finally:
        with _lock:  # acted on: the exception is on its way out (the watchdog stops)
            _armed.clear()
            _pending.clear()
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Signals wait until the block ends: a swap is a few renames that must not stop half-way."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
