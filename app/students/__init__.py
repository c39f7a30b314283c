"""Per-student knowledge-tracing state kept server-side, with compare-and-swap writes (docs/students.md)."""
