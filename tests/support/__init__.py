"""Helpers shared by the test suite (not part of the sluice package)."""
