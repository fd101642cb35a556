"""Whether the arms' steps line up: what a comparison of uneven data must say out loud.

Two arms are aligned when they hold the same step indices, no record line of either was skipped as
unparseable, and every compared column that an arm logs has a value at each of its steps. Anything
else is compared anyway (unpaired where pairs are incomplete) but named here, in the JSON, the text
and notes.txt; ``kit analyze perf --strict`` exits 1 on it. Example::

    doc = alignment(arms, per_arm, ("step_time_s",))
    doc["aligned"], doc["warnings"]
"""

from __future__ import annotations


def step_ranges(steps) -> str:
    """``0-56, 58-199`` for a sorted list of step indices."""
    steps = sorted(steps)
    if not steps:
        return "none"
    parts, start, prev = [], steps[0], steps[0]
    for s in steps[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(parts)


def incomplete_steps(rows, column) -> list[int]:
    """Steps of an arm that lack a value of ``column`` although the arm logs it at other steps."""
    present = [r[column] is not None for r in rows]
    if not any(present):
        return []       # never logged: a missing key (missing_log_keys), not an uneven step
    return [r["step"] for r, ok in zip(rows, present) if not ok]


def alignment(arms, per_arm: dict, columns) -> dict:
    """The ``alignment`` block of summary.json: step counts, missing and incomplete steps, warnings."""
    names = [a.name for a in arms]
    union = sorted(set().union(*(set(a.step_indices) for a in arms)))
    counts = {a.name: len(a.step_indices) for a in arms}
    missing = {a.name: sorted(set(union) - set(a.step_indices)) for a in arms}
    incomplete = {}
    for name in names:
        by_col = {c: incomplete_steps(per_arm[name], c) for c in columns}
        incomplete[name] = {c: s for c, s in by_col.items() if s}
    skipped = {a.name: len(a.unparseable) for a in arms}
    warnings = []
    if len(set(counts.values())) > 1:
        warnings.append("the arms hold different numbers of steps (" + ", ".join(f"{n}: {counts[n]}" for n in names)
                        + "); their means cover different steps and are compared unpaired")
    for name in names:
        if missing[name] and len(names) > 1:
            warnings.append(f"{name} lacks step(s) {step_ranges(missing[name])} that another arm has")
        if skipped[name]:
            warnings.append(f"{name}: {skipped[name]} record line(s) skipped as unparseable; their values are missing")
        for col, steps in incomplete[name].items():
            warnings.append(f"{name}: {col} is missing at step(s) {step_ranges(steps)}; comparisons of {col} "
                            "with it are unpaired over each arm's own steps")
    return {"aligned": not warnings, "union_steps": len(union), "step_counts": counts, "missing_steps": missing,
            "incomplete_steps": incomplete, "unparseable_records": skipped, "warnings": warnings}
