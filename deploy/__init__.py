"""meshrun's controller: the fab tasks and everything they drive (see docs/architecture.md)."""
