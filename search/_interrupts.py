"""A Ctrl-C that Python swallowed is still honoured at the next batch.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives; inside a
weakref callback or a ``__del__`` (SQLAlchemy's ``_collection_gced`` as a study's storage
drops its event registries, say) the exception is printed as "Exception ignored in ..." and
lost, and the search runs on to the end as if the user had not pressed it.
``remembered_interrupts`` installs a SIGINT handler that records the signal before raising (and
keeps the swallowed interrupt's traceback off the terminal: it is not lost, only deferred), and
``raise_if_interrupted`` raises it again where the search is safe to stop (a batch boundary: the
trials told so far are in the storage, so a search with ``--storage`` resumes from them).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

_PENDING = threading.Event()


def _remember(signum, frame) -> None:
    _PENDING.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def remembered_interrupts() -> Iterator[None]:
    """Within the block, SIGINT is recorded before it raises ``KeyboardInterrupt`` (on the main
    thread, where Python's default handler is in place; elsewhere a no-op), and a
    ``KeyboardInterrupt`` Python could not raise is not printed (``sys.unraisablehook``)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    previous_hook = sys.unraisablehook

    def quiet(unraisable) -> None:
        if unraisable.exc_type is KeyboardInterrupt and _PENDING.is_set():
            return  # deferred to ``raise_if_interrupted``
        previous_hook(unraisable)

    _PENDING.clear()
    signal.signal(signal.SIGINT, _remember)
    sys.unraisablehook = quiet
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook
        _PENDING.clear()


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if SIGINT arrived within ``remembered_interrupts`` (once)."""
    if _PENDING.is_set():
        _PENDING.clear()
        raise KeyboardInterrupt
