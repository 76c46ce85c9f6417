"""Stop strings for streamed text: generation ends at the first of them, and the text
shown ends before it.

Text arrives piece by piece (a token's worth at a time), so a stop string may be cut
across pieces. :class:`StopStrings` holds back the end of the text while it may still
be the beginning of a stop string, and lets it go once it cannot be."""

from __future__ import annotations

__all__ = ["StopStrings", "check_stops"]

MAX_STOPS = 16
MAX_STOP_CHARS = 1000


def check_stops(stop) -> list[str]:
    """The stop strings as a list: one string, or a list of them; empty strings dropped.
    ValueError for anything else, more than MAX_STOPS, or one over MAX_STOP_CHARS."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    if len(stop) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stop)}")
    long = [s for s in stop if len(s) > MAX_STOP_CHARS]
    if long:
        raise ValueError(f"a stop string may have at most {MAX_STOP_CHARS} characters, got {len(long[0])}")
    return [s for s in stop if s]


class StopStrings:
    """``push(piece)`` returns the text that can be shown now; ``hit`` is the stop
    string once one has appeared (the text shown ends before it, and later pieces show
    nothing); ``flush()`` returns what was held back at the end; ``text`` is all that
    was shown."""

    def __init__(self, stops=()):
        self.stops = check_stops(stops)
        self.held = ""
        self.hit: str | None = None
        self.text = ""

    def push(self, piece: str) -> str:
        if self.hit is not None or not piece:
            return ""
        if not self.stops:
            self.text += piece
            return piece
        buf = self.held + piece
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            i, self.hit = min(found)   # the one that starts first
            out, self.held = buf[:i], ""
        else:
            keep = max((k for s in self.stops for k in range(1, min(len(s), len(buf) + 1))
                        if buf.endswith(s[:k])), default=0)
            out, self.held = buf[:len(buf) - keep], buf[len(buf) - keep:]
        self.text += out
        return out

    def flush(self) -> str:
        out, self.held = ("" if self.hit is not None else self.held), ""
        self.text += out
        return out
