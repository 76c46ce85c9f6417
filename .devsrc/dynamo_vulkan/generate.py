"""``python -m dynamo_vulkan.generate``: the README's name of :mod:`dynamo_vulkan.llm.generate`, whose
public names it re-exports."""
import sys

from dynamo_vulkan.llm.generate import *  # noqa: F401,F403
from dynamo_vulkan.llm.generate import __all__, main

if __name__ == "__main__":
    sys.exit(main())
