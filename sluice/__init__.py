"""Sluice: a streaming inference operator (Kafka in -> micro-batches -> engine -> Kafka out)."""

__version__ = "0.1.0"
