"""A LangGraph checkpointer on one SQLite file, with claims and fencing tokens.

Public names only; see README.md and docs/semantics.md for what they promise.
"""

from typing import TYPE_CHECKING, Any

from .claims import TOKEN_KEY, Claim, claim_live
from .clock import Clock, ManualClock, SystemClock
from .doctor import Check, Diagnosis, diagnose
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
from .events import Event
from .importer import import_sqlitesaver
from .lease import AsyncLease, Lease
from .maintenance import SweepResult, VacuumReport
from .retention import PruneResult, RetentionPolicy, Retraction
from .saver import FencedSqliteSaver
from .serde import DataOnlySerializer
from .state_view import ChannelChange, CheckpointDiff, Message, ToolCall, diff_channels
from .status import THREAD_STATES, Failure, ThreadStatus, Waiting
from .watch import AsyncEventWatch, EventWatch

if TYPE_CHECKING:
    from .runner import FencedRunner

__all__ = [
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
        from .runner import FencedRunner

        globals()[name] = FencedRunner
        return FencedRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
