"""Building blocks shared by the model families: norms, rotary embedding, the gated MLP, self-attention, and
the decoder layers they make up (``decoder.py``)."""
