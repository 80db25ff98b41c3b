"""The ``tensorrt`` engine (native TensorRT): its pipeline options, the backend, and building or loading the
cached engine plan.
"""
