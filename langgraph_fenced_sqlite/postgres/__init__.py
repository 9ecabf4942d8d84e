"""The fenced checkpointer contract on PostgreSQL: `FencedPostgresSaver`.

Needs the `[postgres]` extra (psycopg 3 and psycopg-pool):
`pip install "langgraph-fenced-sqlite[postgres]"`.
"""

from .importer import import_postgressaver
from .saver import DatabaseClock, FencedPostgresSaver

__all__ = ["DatabaseClock", "FencedPostgresSaver", "import_postgressaver"]
