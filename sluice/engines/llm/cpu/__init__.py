"""The native CPU path: C++ kernels (``native/``, compiled once per machine), their build and loading, the int4
weight layout they read, and the decode layers that call them.
"""
