"""Plain PyTorch decoders built from GGUF files (llama, qwen2, qwen3, phi3, gemma2, gemma3)."""

from .config import DecoderConfig, config_from_gguf
from .decoder import ContextOverflowError, Decoder
from .loader import DEFAULT_MAX_CTX, build_decoder, load_model

__all__ = [
    "DecoderConfig",
    "config_from_gguf",
    "Decoder",
    "ContextOverflowError",
    "build_decoder",
    "load_model",
    "DEFAULT_MAX_CTX",
]
