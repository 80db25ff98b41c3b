"""Quantised weights on the CPU: GGUF blocks kept as they are (:mod:`.gguf_blocks`), packed int4 / int8 /
bf16 matrices and their kernels (:mod:`.packed`), and which weight takes which form (:mod:`.policy`)."""
