"""The ``torch`` engine (PyTorch): its pipeline options, the backend, device placement, and the graphs it
loads (HF text models, image towers, TorchScript or exported programs).
"""
