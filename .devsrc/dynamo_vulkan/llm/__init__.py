"""GGUF language models on the vulkan backend: the file reader and tokenizer, a plain
PyTorch decoder built from a file (models/), generation with sampling and stop strings,
multi-turn chat and the OpenAI-compatible server.

This subpackage uses only the compiler's public API (``dynamo_vulkan``'s namespace,
:mod:`dynamo_vulkan.replay`, :mod:`dynamo_vulkan.precompiled`, :mod:`dynamo_vulkan.config`)
and the custom ops it is built of (:mod:`dynamo_vulkan.gguf`, :mod:`dynamo_vulkan.fused`);
tests/test_layers.py checks it.
"""
