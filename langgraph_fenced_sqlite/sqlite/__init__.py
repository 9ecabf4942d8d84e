"""The SQLite store: one file, one connection, the rules of `core/` in transactions.

`saver.py` is `FencedSqliteSaver`; `engine.py` owns the connection and runs
every transaction on it, `groupcommit.py` lets writes share one durable
commit, `doorbell.py` wakes watchers in other processes, and `schema.py`
holds all of this store's SQL.
"""
