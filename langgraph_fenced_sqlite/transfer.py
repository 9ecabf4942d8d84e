"""`langgraph_fenced_sqlite.transfer`, as the docs import it: see `tools/transfer.py`."""

from .tools.transfer import CopyReport, copy_threads

__all__ = ["CopyReport", "copy_threads"]
