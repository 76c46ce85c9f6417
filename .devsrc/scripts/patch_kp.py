"""Patch kp 0.9.0's sdist with dynamo_vulkan's patches (the command line).

The patches are packaging/kp-dynamo-vulkan/patches/NN-name.patch, each a unified diff
with a header saying what it changes and why; packaging/kp-dynamo-vulkan/kp_patches.py
checks the sources (version, SHA-256) and applies them. Usage:

    python3 scripts/patch_kp.py DIR          # an unpacked kp-0.9.0 sdist, in place
    python3 scripts/patch_kp.py SDIST DEST   # check kp-0.9.0.tar.gz, unpack under DEST, patch
    python3 scripts/patch_kp.py --patch-set  # the marker the patches compile into kp

Running it again on a patched tree changes nothing.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "packaging" / "kp-dynamo-vulkan"))
import kp_patches  # noqa: E402

if __name__ == "__main__":
    sys.exit(kp_patches.main(sys.argv[1:]))
