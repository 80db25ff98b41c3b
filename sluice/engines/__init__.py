"""Engine layer: batch engines (ONNX, TensorRT, PyTorch, Python) and continuous engines (LLM)."""
