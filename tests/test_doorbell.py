"""The doorbell: a ring from another process wakes a listener; no ring, no wake.

The bell is only a hint (CONTRACT §4: watchers must still see every commit),
so what matters is that a listener opened before a ring always wakes for it,
across processes, and that a place where no bell can be had says so (None)
instead of pretending to listen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from langgraph_fenced_sqlite.doorbell import Listener, Ringer, bell_path


def test_ring_from_another_process_wakes_a_listener(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    listener = Listener.open(db)
    assert listener is not None
    try:
        assert listener.wait(0.05) is False  # nothing rang yet
        code = (
            "import sys; from langgraph_fenced_sqlite.doorbell import Ringer; "
            "r = Ringer(sys.argv[1]); assert not r.mute; r.ring(); r.close()"
        )
        subprocess.run([sys.executable, "-c", code, db], check=True, timeout=60)
        # The ring landed before this wait began: listening started at open.
        assert listener.wait(30.0) is True
        assert listener.wait(0.05) is False  # drained: one ring, one wake
    finally:
        listener.close()


def test_a_waiting_listener_wakes_when_another_thread_rings(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    listener, ringer = Listener.open(db), Ringer(db)
    assert listener is not None
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(listener.wait(30.0)))
    waiter.start()
    ringer.ring()
    waiter.join(timeout=60)
    assert woke == [True]
    ringer.close()
    listener.close()
    listener.close()  # twice is fine
    assert listener.wait(0.01) is False


def test_a_replaced_bell_is_listened_to_again(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    listener = Listener.open(db)
    assert listener is not None
    try:
        os.unlink(bell_path(db))  # an operator removes it: the old watch wakes once
        assert listener.wait(30.0) is True
        ringer = Ringer(db)  # a writer recreates it and rings
        ringer.ring()
        assert listener.wait(30.0) is True
        ringer.close()
    finally:
        listener.close()


def test_no_bell_where_it_cannot_be_created(tmp_path) -> None:
    missing = str(tmp_path / "no-such-dir" / "x.db")
    assert Listener.open(missing) is None
    ringer = Ringer(missing)
    assert ringer.mute
    ringer.ring()  # a mute bell is a no-op, never an error
