"""A LangGraph checkpointer on one SQLite file, with claims and fencing tokens.

Public names only; see README.md and CONTRACT.md for what they promise.
"""

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
    RunCancelled,
    RunTimedOut,
    SerializationError,
    StaleClaim,
    StoreBusy,
    StoreClosed,
    StoreError,
    TenantMismatch,
    ThreadBusy,
    UndecodableRow,
    UnsupportedFormat,
    WrongProcess,
    WrongThread,
)
from .events import Event
from .importer import import_sqlitesaver
from .lease import AsyncLease, Lease
from .retention import PruneResult, RetentionPolicy, Retraction
from .runner import FencedRunner
from .saver import FencedSqliteSaver
from .serde import DataOnlySerializer
from .watch import AsyncEventWatch, EventWatch

__all__ = [
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
    "RunCancelled",
    "RunTimedOut",
    "SerializationError",
    "StaleClaim",
    "StoreBusy",
    "StoreClosed",
    "StoreError",
    "SystemClock",
    "TenantMismatch",
    "ThreadBusy",
    "UndecodableRow",
    "UnsupportedFormat",
    "WrongProcess",
    "WrongThread",
    "import_sqlitesaver",
]

__version__ = "0.1.0"
