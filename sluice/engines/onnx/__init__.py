"""The ``onnx`` engine (ONNX Runtime): its pipeline options, the backend that runs a graph, execution-provider
choice, int8 quantisation and denormal handling.
"""
