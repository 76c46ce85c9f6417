"""``python -m dynamo_vulkan.chat``: the README's name of :mod:`dynamo_vulkan.llm.chat`, whose
public names it re-exports."""
import sys

from dynamo_vulkan.llm.chat import *  # noqa: F401,F403
from dynamo_vulkan.llm.chat import __all__, main

if __name__ == "__main__":
    sys.exit(main())
