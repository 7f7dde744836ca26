"""Work a run does on a thread of its own while its main work goes on."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def in_background(name: str, loop: Callable[[threading.Event], None]) -> Iterator[None]:
    """Run ``loop(stop)`` on a daemon thread while the block runs; ``stop`` is set when
    the block ends, and the thread is waited for."""
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
