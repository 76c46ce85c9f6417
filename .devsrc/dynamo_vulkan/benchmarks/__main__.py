"""python -m dynamo_vulkan.benchmarks: see benchmarks/cli.py (or --help)."""
import sys

from .cli import main

sys.exit(main())
