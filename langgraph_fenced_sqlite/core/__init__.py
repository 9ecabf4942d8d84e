"""What the contract decides, written once for both stores.

The rules here (the saver's methods, claims, events, retention and runs,
serde and the data-only proof, validation, the waiting loops) run over a
typed store interface (`store.py`) and import neither `sqlite3` nor
`psycopg` (tests/test_layers.py checks it): each store's own modules,
`sqlite/` and `postgres/`, apply them in transactions.
"""
