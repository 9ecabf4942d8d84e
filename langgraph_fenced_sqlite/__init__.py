"""A LangGraph checkpointer on one SQLite file, with claims and fencing tokens.

Public names only; see README.md and docs/semantics.md for what they promise.
"""

from .api_inspect import THREAD_STATES, ThreadStatus
from .claims import TOKEN_KEY, Claim
from .clock import Clock, ManualClock, SystemClock
from .errors import (
    CheckpointConflict,
    CheckpointNotFound,
    ClaimError,
    FencedSqliteError,
    InvalidArgument,
    ReadOnlyStore,
    ReplayUnavailable,
    SerializationError,
    StaleClaim,
    StoreBusy,
    StoreClosed,
    StoreError,
    ThreadBusy,
    UndecodableRow,
    UnsupportedFormat,
    WrongProcess,
    WrongThread,
)
from .events import Event
from .importer import import_sqlitesaver
from .lease import AsyncLease, Lease
from .maintenance import SweepResult, VacuumReport
from .retention import PruneResult, RetentionPolicy, Retraction
from .runner import FencedRunner
from .saver import FencedSqliteSaver
from .serde import DataOnlySerializer
from .watch import AsyncEventWatch, EventWatch

__all__ = [
    "THREAD_STATES",
    "TOKEN_KEY",
    "AsyncEventWatch",
    "AsyncLease",
    "CheckpointConflict",
    "CheckpointNotFound",
    "Claim",
    "ClaimError",
    "Clock",
    "DataOnlySerializer",
    "Event",
    "EventWatch",
    "FencedRunner",
    "FencedSqliteError",
    "FencedSqliteSaver",
    "InvalidArgument",
    "Lease",
    "ManualClock",
    "PruneResult",
    "ReadOnlyStore",
    "ReplayUnavailable",
    "RetentionPolicy",
    "Retraction",
    "SerializationError",
    "StaleClaim",
    "StoreBusy",
    "StoreClosed",
    "StoreError",
    "SweepResult",
    "SystemClock",
    "ThreadBusy",
    "ThreadStatus",
    "UndecodableRow",
    "UnsupportedFormat",
    "VacuumReport",
    "WrongProcess",
    "WrongThread",
    "import_sqlitesaver",
]

__version__ = "0.1.0"
