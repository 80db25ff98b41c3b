"""Reading a model for the LLM engine: what a checkpoint says (HF directory or GGUF header), its weights, and
its tokenizer with the chat template.
"""
