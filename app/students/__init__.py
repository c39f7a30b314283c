"""Per-student knowledge-tracing state kept server-side: ids, the store interface, two stores.

- `ids`: `validate_student_id` (the id rules).
- `store`: `StateStore` (the interface), `StudentState`, `StudentPage`, and the errors
  `StoreUnavailable` (503), `StateVersionMismatch` (409), `RevisionConflict`.
- `sqlite_store.SqliteStateStore` (embedded default) and `redis_store.RedisStateStore` (several replicas).
- `factory.open_store(url)`: MNEMO_STATE_URL -> a store.
- `update.update_state`: the read / compute / compare-and-swap / retry loop every append goes through.
- `io.StoreCalls`: the store's blocking calls on threads of their own (a stalled store holds up /students only).

Design, durability and the chunking semantics: docs/students.md.
"""
