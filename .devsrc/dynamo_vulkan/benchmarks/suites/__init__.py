"""One module per suite; each has DESCRIPTION and run(bench). Order here is run order."""
from importlib import import_module

NAMES = ("elementwise", "matmul", "mlp", "block", "compile", "small_kernels", "gguf_linear", "llm",
         "train")


def load(name: str):
    if name not in NAMES:
        raise KeyError(name)
    return import_module(f"{__name__}.{name}")
