"""The tiny task and model of the walking skeleton: a locally trained byte-level BPE tokenizer (`tokenizer`),
a ~1M-parameter Qwen2 built from a config (`model`), and a short supervised warm start that makes the demo's
base model (`warmstart`; see docs/tiny_model.md). Data: ``rlvr_core.data.synthetic``.

The package imports none of its modules (they import torch and transformers): import the one you need.
"""
