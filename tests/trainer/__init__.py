"""Helpers shared by the trainer tests (tests/test_train_*.py)."""
