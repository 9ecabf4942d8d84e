"""A LangGraph checkpointer on one SQLite file, with claims and fencing tokens.

Public names only; see docs/semantics.md for what they promise, and docs/ for the guides.
"""

from typing import TYPE_CHECKING, Any

from .clock import Clock, ManualClock, SystemClock
from .core.claims import TOKEN_KEY, Claim, claim_live
from .core.encryption import Encryption
from .core.events import Event
from .core.lease import AsyncLease, Lease
from .core.maintenance import SweepResult, VacuumReport
from .core.retention import (
    Expired,
    Expiry,
    ExpiryReport,
    PruneResult,
    RetentionPolicy,
    Retraction,
    ThreadTTL,
)
from .core.serde import DataOnlySerializer
from .core.state_view import ChannelChange, CheckpointDiff, Message, ToolCall, diff_channels
from .core.status import THREAD_STATES, Failure, ThreadStatus, Waiting
from .core.watch import AsyncEventWatch, EventWatch
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
    SchemaTooOld,
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
from .sqlite.saver import FencedSqliteSaver
from .tools.doctor import Check, Diagnosis, diagnose
from .tools.importer import import_sqlitesaver

if TYPE_CHECKING:
    from .runner.runner import FencedRunner

__all__ = [
    "Encryption",
    "THREAD_STATES",
    "TOKEN_KEY",
    "AsyncEventWatch",
    "AsyncLease",
    "ChannelChange",
    "Check",
    "CheckpointConflict",
    "CheckpointDiff",
    "CheckpointNotFound",
    "Claim",
    "ClaimError",
    "Clock",
    "DataOnlySerializer",
    "Diagnosis",
    "Event",
    "EventWatch",
    "Expired",
    "Expiry",
    "ExpiryReport",
    "Failure",
    "FencedRunner",
    "FencedSqliteError",
    "FencedSqliteSaver",
    "InvalidArgument",
    "Lease",
    "ManualClock",
    "Message",
    "PruneResult",
    "ReadOnlyStore",
    "ReplayUnavailable",
    "RetentionPolicy",
    "Retraction",
    "RunCancelled",
    "RunTimedOut",
    "SchemaTooOld",
    "SerializationError",
    "StaleClaim",
    "StoreBusy",
    "StoreClosed",
    "StoreError",
    "SweepResult",
    "SystemClock",
    "TenantMismatch",
    "ThreadBusy",
    "ThreadTTL",
    "ThreadStatus",
    "ToolCall",
    "UndecodableRow",
    "UnsupportedFormat",
    "VacuumReport",
    "Waiting",
    "WrongProcess",
    "WrongThread",
    "claim_live",
    "diagnose",
    "diff_channels",
    "import_sqlitesaver",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Load `FencedRunner` on first use.

    Its module imports `langgraph.graph`, and with it langchain_core's tracers
    and langsmith: about 0.6 s that a saver alone, and every `lgfs` command,
    would otherwise pay at import.
    """
    if name == "FencedRunner":
        from .runner.runner import FencedRunner

        globals()[name] = FencedRunner
        return FencedRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
