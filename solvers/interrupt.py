"""Ctrl-C during a CP-SAT solve: stop the search at once and raise ``KeyboardInterrupt``.

While ``CpSolver.Solve`` runs, the main thread is inside C++, so Python's own
SIGINT handler (which raises ``KeyboardInterrupt``) waits for the solve to
return, up to its whole time limit; and CP-SAT's own SIGINT handling
(``catch_sigint_signal``, on by default) ends the search but returns its
best plan as if nothing had happened, which the CLI would then write; and
once its solve is over it leaves SIGINT at the system default, so that the
next Ctrl-C kills the process without a word. Every CP-SAT solve in
schedopt turns it off.
:func:`interruptible` turns the latter off and has a thread watch the
signal wakeup fd (written by the interpreter's C-level handler the moment
the signal arrives): on SIGINT it calls ``stop_search()``, the solve returns
within milliseconds, and Python's handler raises ``KeyboardInterrupt`` on
the next bytecode, before anything is written.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from typing import Any, Iterator

__all__ = ["interruptible"]


@contextlib.contextmanager
def interruptible(solver: Any) -> Iterator[None]:
    """Run the ``with`` body (a ``solver.Solve`` call) so that SIGINT stops ``solver`` at once."""
    solver.parameters.catch_sigint_signal = False
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # not ours to watch: another thread, or a program with its own handler
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def watch() -> None:
        while data := reader.recv(64):
            if signal.SIGINT in data:
                solver.stop_search()
            if 0 in data:  # our own sentinel: the solve is over
                return

    watcher = threading.Thread(target=watch, name="schedopt-sigint-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever a native library did to it
        signal.set_wakeup_fd(previous)
        writer.send(b"\0")
        watcher.join()
        reader.close()
        writer.close()
