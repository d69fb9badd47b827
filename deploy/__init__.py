"""meshrun's controller side: inventory → plan → execute → render (see docs/architecture.md)."""
