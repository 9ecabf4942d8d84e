"""The sweeper a saver starts for its `expiry` option: `expire()` every so often, by itself.

Invariant: the sweeper is one daemon thread per saver that holds the saver
only weakly between passes (a saver dropped without `close()` is collected,
with its ResourceWarning, and the thread then ends), runs one `expire` pass
at a time, and stops between two threads' transactions once asked:
`close()` sets its stop event and joins it, so no pass outlives the store
and no thread is leaked. A pass that fails (the file busy past
`busy_timeout`, say, or an error of the `on_expire` callback, which ends
its pass) is logged and the next one comes at its time.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from ..errors import StoreClosed

__all__ = ["Sweeper"]

log = logging.getLogger("langgraph_fenced_sqlite.sweeper")


class Sweeper:
    """Run `saver._expire_pass` now and then every `every` seconds, on a daemon thread."""

    def __init__(self, saver: Any, every: float) -> None:
        """Start sweeping `saver` (held weakly) every `every` seconds."""
        self._stop = threading.Event()
        # Collected unclosed: the thread ends at once instead of at its next pass.
        self._saver = weakref.ref(saver, lambda _ref: self._stop.set())
        self._every = every
        self.passes = 0
        self._thread = threading.Thread(target=self._run, name="lgfs-sweeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            saver = self._saver()
            if saver is None:
                return
            try:
                saver._expire_pass(self._stop.is_set)
            except StoreClosed:
                return
            except Exception:  # noqa: BLE001 - a sweeper outlives a failed pass
                log.exception("expire pass failed on %s; next in %ss", saver.path, self._every)
            finally:
                del saver
            self.passes += 1
            self._stop.wait(self._every)

    @property
    def alive(self) -> bool:
        """Whether the sweeper's thread is running."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ask the sweeper to stop and wait for its pass to end (not from its own thread)."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
