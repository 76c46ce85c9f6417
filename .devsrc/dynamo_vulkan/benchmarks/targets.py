"""Issue 6's targets resolved against the rows of this run: ours, baseline, ratio, goal, met."""
from __future__ import annotations

from .harness import Target
from .record import Row, TargetResult


def _find(rows: list[Row], key) -> Row | None:
    for r in rows:
        if (r.suite, r.workload, r.backend) == tuple(key):
            return r
    return None


def _value(row: Row | None, metric: str) -> float | None:
    if row is None:
        return None
    if metric == "ms":
        return row.ms.median if row.ms else None
    return row.throughput


def resolve(targets: list[Target], rows: list[Row], memory: list[dict]) -> list[TargetResult]:
    out = []
    for t in targets:
        ours_row = _find(rows, t.ours)
        ours = _value(ours_row, t.metric)
        unit = "ms" if t.metric == "ms" else (ours_row.unit if ours_row else "")
        if t.baseline is not None:
            base_row = _find(rows, t.baseline)
            base, base_name = _value(base_row, t.metric), t.baseline[2]
            missing = "" if base_row is not None else f"no {t.baseline[2]} row in this run"
            if base_row is not None and base is None:
                missing = f"{t.baseline[2]} failed: {base_row.note}"
        elif t.baseline_value is not None and t.baseline_value[0]:
            base, base_name = t.baseline_value
            missing = ""
        else:
            base, base_name, missing = None, "", "no baseline measured on this machine"
        ratio = float(ours / base) if ours is not None and base else None
        if t.higher_is_better:
            goal, met = f">= {t.goal:g}", (ratio >= t.goal) if ratio is not None else None
        else:
            goal, met = f"<= {t.goal:g}", (ratio <= t.goal) if ratio is not None else None
        note = "; ".join(x for x in (t.note, missing, "" if ours is not None else "ours not measured") if x)
        out.append(TargetResult(t.name, ours, base, base_name, unit, ratio, goal, met,
                                ours_row.err if ours_row else None, note))
    for m in memory:
        ours, limit = m["ours"], m["limit"]
        ratio = float(ours / limit) if ours is not None and limit else None
        out.append(TargetResult(m["name"], ours / 2**20 if ours is not None else None, limit / 2**20, "limit",
                                "MiB", ratio, "<= 1", (ratio <= 1) if ratio is not None else None, None, m["how"]))
    return out
