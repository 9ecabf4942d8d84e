"""The fenced checkpointer contract on PostgreSQL: `FencedPostgresSaver`.

Needs the `[postgres]` extra (psycopg 3 and psycopg-pool):
`pip install "langgraph-fenced-sqlite[postgres]"`.
"""

# A tool (`tools/import_postgres.py`), exported here where the docs import it.
from ..tools.import_postgres import import_postgressaver  # noqa: E402
from .saver import DatabaseClock, FencedPostgresSaver

__all__ = ["DatabaseClock", "FencedPostgresSaver", "import_postgressaver"]
