"""Backends: each loads one model and runs ``run(feeds) -> outputs`` (ONNX Runtime, PyTorch, TensorRT).

A backend knows nothing about text: tokenising, collating and post-processing belong to the task
(:mod:`sluice.engines.tasks`). :class:`sluice.engines.backends.backend_contract.Backend` is the contract.
"""
