"""`FencedRunner`: compiled LangGraph graphs run under a claim on their thread."""

from .runner import FencedRunner

__all__ = ["FencedRunner"]
