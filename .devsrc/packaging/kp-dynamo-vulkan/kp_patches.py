"""dynamo_vulkan's patches to kp 0.9.0's sdist: read, checked and applied (stdlib only).

patches/NN-name.patch are unified diffs against the unpacked sdist (paths a/... b/...,
as `git apply` and `patch -p1` take them), applied in name order, each one starting
with a header that says what it changes and why. The sources are pinned: an sdist by
its SHA-256, an unpacked tree by its PKG-INFO version and the SHA-256 of every file the
patches touch. So every hunk applies exactly where it says, with no fuzz and no offset,
and anything else is refused with what differs and what to do. Applying to a tree that
already carries exactly these patches changes nothing.

Used by kp_build.py (the pip build) and scripts/patch_kp.py (the command line).
"""
from __future__ import annotations

import hashlib
import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

KP_VERSION = "0.9.0"
SDIST_SHA256 = "98e583dc6e9731ff6d7a3e3317817e4d93f7b2945929619e29a56325db279949"
# the unpacked sdist's files that the patches change, as PyPI's kp-0.9.0.tar.gz holds them
BASE_SHA256 = {
    "setup.py": "2119aad8caf10f8b438f5912b26adac2e0eedcd6a118ec91a6aec6c165eac991",
    "python/src/main.cpp": "87b70cfb36bbed7c67ba26d6d6516b6ab8e10af5b052e895c9b827b536ddbcd7",
    "src/Algorithm.cpp": "5bb273d3a5cae1963e1431882bd38c5c4332db5657b2b6bec740706da808f537",
    "src/include/kompute/Algorithm.hpp": "7a037891dfdab79c421234ccedf5d4f546430e81078296b27e8f42d402d1b22e",
    "src/Manager.cpp": "0fd6acdaf21b242e28a19c01e24ef2b52bf053b900e7d32d2d14228d262002ae",
    "src/Sequence.cpp": "a156486a2aeba77665997cfb9293805662dbd7d0687abafd254d1693dd2249a4",
    "src/Tensor.cpp": "4836d1cf0026ff5dd925b8c8be53bacaabf134eaf3df2a54b210ab993a433a8b",
    "src/include/kompute/Manager.hpp": "e1835e4a85c37b4ac5c81cc227b09dd17fd23be617a979f75bc4e05d0a282996",
    "src/include/kompute/Sequence.hpp": "26b5229f8c5f5dc8483ca838c1e10cd186d864a97d22637581173cee8770380f",
    "src/include/kompute/Tensor.hpp": "3f87143f0dc91cc0c392c7f948d2a08851bc405c48554be7bb316d81c9dfdb66",
}
PATCH_DIR = Path(__file__).resolve().parent / "patches"
# the last patch sets the marker that the runtime and the setup scripts compare
MARKER = re.compile(r'^\+    m\.attr\("dynamo_vulkan_patches"\) = (\d+);$', re.M)
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
FRESH = f"unpack PyPI's kp-{KP_VERSION}.tar.gz (sha256 {SDIST_SHA256}) afresh and patch that"


class PatchError(RuntimeError):
    """A patch that does not read or apply, or sources that are not kp 0.9.0's."""


@dataclass
class Hunk:
    old_start: int          # 1-based line of the file before this patch
    new_start: int
    lines: list[tuple[str, str]]    # (" " | "-" | "+", the line with its newline)

    def side(self, tags: str) -> list[str]:
        return [text for tag, text in self.lines if tag in tags]

    def reversed(self) -> "Hunk":
        swap = {" ": " ", "-": "+", "+": "-"}
        return Hunk(self.new_start, self.old_start, [(swap[t], s) for t, s in self.lines])


@dataclass
class FilePatch:
    path: str               # relative to the unpacked sdist
    hunks: list[Hunk]


@dataclass
class Patch:
    name: str               # the file name without .patch, e.g. 04-shared-descriptor-pools
    header: str             # what it changes and why
    files: list[FilePatch]


def _strip_prefix(line: str, marker: str, prefix: str, where: str) -> str:
    name = line[len(marker):].rstrip("\n").split("\t")[0]
    if not name.startswith(prefix):
        raise PatchError(f"{where}: expected '{marker}{prefix}PATH', found {line.rstrip()!r}")
    return name[len(prefix):]


def read_patch(path: Path) -> Patch:
    """One patch file: its header (the text before the first '--- ') and its hunks."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith("--- ")), None)
    if start is None:
        raise PatchError(f"{path}: no '--- a/PATH' line, so no diff")
    header = "".join(lines[:start]).strip()
    if not header:
        raise PatchError(f"{path}: no header; each patch starts with what it changes and why")
    files: list[FilePatch] = []
    i = start
    while i < len(lines):
        where = f"{path}:{i + 1}"
        if not lines[i].strip():
            i += 1
            continue
        if not lines[i].startswith("--- ") or i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"{where}: expected a '--- a/PATH' and '+++ b/PATH' pair, found {lines[i].rstrip()!r}")
        old, new = _strip_prefix(lines[i], "--- ", "a/", where), _strip_prefix(lines[i + 1], "+++ ", "b/", where)
        if old != new:
            raise PatchError(f"{where}: renames ({old} -> {new}) are not supported")
        fp = FilePatch(old, [])
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = HUNK.match(lines[i])
            if m is None:
                raise PatchError(f"{path}:{i + 1}: malformed hunk header {lines[i].rstrip()!r}")
            old_n = 1 if m.group(2) is None else int(m.group(2))
            new_n = 1 if m.group(4) is None else int(m.group(4))
            hunk = Hunk(int(m.group(1)), int(m.group(3)), [])
            i += 1
            while old_n or new_n:
                if i >= len(lines):
                    raise PatchError(f"{path}: the hunk ending the file is short of lines")
                line = lines[i]
                tag, text = (" ", "\n") if line in ("\n", "") else (line[0], line[1:])
                if tag not in " -+" or line.startswith("\\"):
                    raise PatchError(f"{path}:{i + 1}: unexpected line in a hunk {line.rstrip()!r}"
                                     " (files without a final newline are not supported)")
                if tag in " -":
                    old_n -= 1
                if tag in " +":
                    new_n -= 1
                if old_n < 0 or new_n < 0:
                    raise PatchError(f"{path}:{i + 1}: the hunk has more lines than its header says")
                hunk.lines.append((tag, text))
                i += 1
            fp.hunks.append(hunk)
        if not fp.hunks:
            raise PatchError(f"{path}: {fp.path} has no hunks")
        files.append(fp)
    return Patch(path.name[:-len(".patch")], header, files)


def patches(patch_dir: Path = PATCH_DIR) -> list[Patch]:
    """Every patch, in the order they apply."""
    found = sorted(patch_dir.glob("*.patch"))
    if not found:
        raise PatchError(f"no *.patch files in {patch_dir}")
    return [read_patch(p) for p in found]


def patch_set(patch_dir: Path = PATCH_DIR) -> int:
    """The marker (kp.dynamo_vulkan_patches) the last patch compiles into kp."""
    last = sorted(patch_dir.glob("*.patch"))[-1]
    m = MARKER.search(last.read_text(encoding="utf-8"))
    if m is None:
        raise PatchError(f"{last} does not set kp.dynamo_vulkan_patches: the last patch sets the marker")
    return int(m.group(1))


def apply_hunks(lines: list[str], hunks: list[Hunk], where: str) -> list[str]:
    """The file's lines with the hunks applied, each exactly at its line."""
    out: list[str] = []
    pos = 0                 # lines[:pos] are consumed
    for h in hunks:
        old = h.side(" -")
        at = h.old_start - 1 if old else h.old_start      # an empty old side inserts after its line
        if at < pos or lines[at:at + len(old)] != old:
            found = "".join(lines[at:at + len(old)])[:400]
            raise PatchError(f"{where}: the hunk at line {h.old_start} does not match; expected\n"
                             f"{''.join(old)[:400]}found\n{found}")
        new = h.side(" +")
        lands = len(out) + (at - pos) + (1 if new else 0)    # an empty new side: the line before
        if h.new_start != lands:
            raise PatchError(f"{where}: the hunk at line {h.old_start} says it lands at line "
                             f"{h.new_start}, it lands at {lands}")
        out += lines[pos:at] + new
        pos = at + len(old)
    return out + lines[pos:]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_hunks(series: list[Patch], path: str) -> list[tuple[str, list[Hunk]]]:
    """The hunks each patch applies to one file, in order: (where, hunks)."""
    return [(f"{p.name}.patch, {fp.path}", fp.hunks) for p in series for fp in p.files if fp.path == path]


def _patched(lines: list[str], steps: list[tuple[str, list[Hunk]]]) -> list[str]:
    for where, hunks in steps:
        lines = apply_hunks(lines, hunks, where)
    return lines


def _unpatched(lines: list[str], steps: list[tuple[str, list[Hunk]]]) -> list[str] | None:
    """The file before the patches, when it is exactly the file after them; else None."""
    try:
        for where, hunks in reversed(steps):
            lines = apply_hunks(lines, [h.reversed() for h in hunks], where)
    except PatchError:
        return None
    return lines


def _encode(lines: list[str]) -> bytes:
    return "".join(lines).encode("utf-8", "surrogateescape")


def check_version(src: Path) -> None:
    info = src / "PKG-INFO"
    if not info.is_file():
        raise PatchError(f"{src} is not an unpacked kp sdist (no PKG-INFO): {FRESH}")
    m = re.search(r"^Version: (\S+)$", info.read_text(encoding="utf-8", errors="replace"), re.M)
    version = m.group(1) if m else "unknown"
    if version != KP_VERSION:
        raise PatchError(f"{src} holds kp {version}'s source, these patches are for kp {KP_VERSION}: {FRESH}")


def apply(src: Path, patch_dir: Path = PATCH_DIR) -> str:
    """Patch the unpacked sdist at src in place: 'applied', or 'already applied' when src
    carries exactly these patches. PatchError when it is neither kp 0.9.0's nor that."""
    src = Path(src)
    series = patches(patch_dir)
    check_version(src)
    touched = sorted({fp.path for p in series for fp in p.files})
    unpinned = [t for t in touched if t not in BASE_SHA256]
    if unpinned:
        raise PatchError(f"the patches change {', '.join(unpinned)}, whose kp {KP_VERSION} sha256 "
                         "kp_patches.BASE_SHA256 does not pin")
    missing = [t for t in touched if not (src / t).is_file()]
    if missing:
        raise PatchError(f"{src} lacks {', '.join(missing)}: {FRESH}")
    raw = {t: (src / t).read_bytes() for t in touched}
    texts = {t: b.decode("utf-8", "surrogateescape").splitlines(keepends=True) for t, b in raw.items()}
    steps = {t: _file_hunks(series, t) for t in touched}
    pristine = [t for t in touched if _sha256(raw[t]) == BASE_SHA256[t]]
    if len(pristine) == len(touched):
        patched = {t: _patched(texts[t], steps[t]) for t in touched}
        for t in touched:
            (src / t).write_bytes(_encode(patched[t]))
        return "applied"

    def carries(t: str) -> bool:
        base = _unpatched(texts[t], steps[t])
        return base is not None and _sha256(_encode(base)) == BASE_SHA256[t]
    done = [t for t in touched if t not in pristine and carries(t)]
    if len(done) == len(touched):
        return "already applied"
    other = [t for t in touched if t not in pristine and t not in done]
    if other:
        raise PatchError(f"{src}: {', '.join(other)} differ from kp {KP_VERSION}'s sdist and are not it "
                         f"with exactly these patches (patched otherwise, or edited): {FRESH}")
    raise PatchError(f"{src} is partly patched ({', '.join(done)} carry these patches, "
                     f"{', '.join(pristine)} do not): {FRESH}")


def check_sdist(sdist: Path) -> None:
    """PatchError unless sdist is PyPI's kp-0.9.0.tar.gz."""
    digest = _sha256(Path(sdist).read_bytes())
    if digest != SDIST_SHA256:
        raise PatchError(f"{sdist} has sha256 {digest}, not kp {KP_VERSION}'s sdist ({SDIST_SHA256})")


def unpack(sdist: Path, dest: Path) -> Path:
    """The checked sdist unpacked under dest: the kp-0.9.0 directory, not yet patched."""
    check_sdist(sdist)
    with tarfile.open(sdist) as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **safe)
    return Path(dest) / f"kp-{KP_VERSION}"


USAGE = f"""usage: patch_kp.py DIR            patch an unpacked kp {KP_VERSION} sdist in place
       patch_kp.py SDIST DEST     check kp-{KP_VERSION}.tar.gz, unpack it under DEST and patch it
       patch_kp.py --patch-set    print the marker the patches compile into kp"""


def main(argv: list[str]) -> int:
    try:
        if argv == ["--patch-set"]:
            print(patch_set())
            return 0
        if len(argv) == 1 and Path(argv[0]).is_dir():
            src = Path(argv[0])
        elif len(argv) == 2 and Path(argv[0]).is_file():
            src = unpack(Path(argv[0]), Path(argv[1]))
        else:
            print(USAGE, file=sys.stderr)
            return 2
        print(f"patch_kp: {src}: {apply(src)} ({len(patches())} patches)")
        return 0
    except PatchError as e:
        print(f"patch_kp: {e}", file=sys.stderr)
        return 1
