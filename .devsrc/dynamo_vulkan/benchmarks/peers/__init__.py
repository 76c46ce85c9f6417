"""Other runtimes measured beside ours when they are installed: IREE on Vulkan, llama.cpp on Vulkan."""


class PeerUnavailable(RuntimeError):
    """A peer that is not installed or cannot run here; the message says why (it becomes the note)."""
