"""`lgfs`, the operator's command line: each command parses, calls the library, prints."""

from .main import main

__all__ = ["main"]
