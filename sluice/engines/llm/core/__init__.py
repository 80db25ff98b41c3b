"""The LLM engine's bookkeeping: requests, the scheduler, KV-cache blocks, speculation and outputs.

Plain Python over token ids and block numbers -- nothing here imports torch (a test imports each module in a
fresh interpreter and fails if torch is loaded), so every decision is unit-tested without a model.
"""
