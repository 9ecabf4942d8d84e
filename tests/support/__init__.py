"""The tests' one support layer: shared helpers, each module imported by its name.

`pyproject.toml` puts `tests/` on `sys.path` (`pythonpath`), so any test, in
any folder, writes `from support.puts import put`. Fixtures (a store, a
clock, a PostgreSQL server) stay in `tests/conftest.py`; no test imports
from conftest.

- `configs`: the config dicts a test hands a graph (`config`) or a saver (`saver_config`).
- `puts`: checkpoints put straight through `saver.put` (`put`, `put_chain`, `put_next`...).
- `files`: a file's whole state (`dump`), its schema, bytes and version; shared
  files per module (`file_fixtures`); older files; resealed rows.
- `graphs`: the graphs every suite runs (the ops graph, the agent graph, the
  importers' source graph, the log and chain graphs) and the threads they write.
- `processes`: the one harness for real other processes (start, release
  together, wait for a mark, reap; `lgfs`; the PostgreSQL workers of `pg_child`).
- `waiting`: bounded waits on other threads, a held store, a real Ctrl-C.
- `postgres`: what a PostgreSQL store holds, read with plain psycopg.
- `user_types`: a user's own types, importable by a fresh process.
- `model`: the pure model of docs/semantics.md the model-based test checks against.
- `crash_dumps`: the pytest plugin that reports a crashed worker's traceback.
"""
