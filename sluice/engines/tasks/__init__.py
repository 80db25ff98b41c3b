"""Tasks: what a model's inputs and outputs mean (tokenise, collate, post-process), on any backend.

:mod:`sluice.engines.tasks.base` holds the contract, :mod:`sluice.engines.tasks.registry` the names.
"""
