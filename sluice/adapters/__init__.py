"""Sluice inside other stream processors: its batcher and engines behind their APIs (faust.py: a Faust agent)."""
