"""The GRPO trainer: a real transformers model trained with verifiable rewards, on CPU or GPU.

Modules are imported on demand (torch is heavy); this package file imports nothing.
"""
