"""The model side of the LLM engine: the runner that turns a scheduled step into tensors, the causal LM,
attention, sampling, layers and the model families (``families/``). Everything here computes with torch.
"""
