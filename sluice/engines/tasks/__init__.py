"""Tasks: what a model's inputs and outputs mean (tokenise, collate, post-process), on any backend.

:mod:`sluice.engines.tasks.task_contract` holds the contract, :mod:`sluice.engines.tasks.task_types` the names.
"""
