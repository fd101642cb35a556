"""Is a set of runs a controlled comparison? Only the run manifests can say so.

For every arm against the reference (the first arm), both runs need a ``manifest.json`` and
``kit.compare.compare_run_manifests(a, b)`` must report ``.controlled``. A bare log, a missing
comparison function or any uncontrolled difference makes the pair NOT controlled, with the reason;
then every number that compares the arms is labelled descriptive, not causal. Example::

    verdict = assess(arms)
    verdict.controlled          # False for bare logs
    verdict.label               # "descriptive, not causal"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

CONTROLLED_LABEL = "controlled comparison"
DESCRIPTIVE_LABEL = "descriptive, not causal"


@dataclass(frozen=True)
class PairVerdict:
    reference: str
    other: str
    controlled: bool
    reasons: tuple[str, ...]        # why not controlled; empty when controlled
    uncontrolled_paths: tuple[str, ...]

    def to_json(self) -> dict:
        return {"reference": self.reference, "other": self.other, "controlled": self.controlled,
                "reasons": list(self.reasons), "uncontrolled_paths": list(self.uncontrolled_paths)}


@dataclass(frozen=True)
class Comparability:
    pairs: tuple[PairVerdict, ...]

    @property
    def applicable(self) -> bool:
        return bool(self.pairs)

    @property
    def controlled(self) -> bool:
        return self.applicable and all(p.controlled for p in self.pairs)

    @property
    def label(self) -> str:
        return CONTROLLED_LABEL if self.controlled else DESCRIPTIVE_LABEL

    def pair(self, other: str) -> PairVerdict | None:
        return next((p for p in self.pairs if p.other == other), None)

    def headline(self) -> str:
        """One line for CLI text, CSVs and figure subtitles."""
        if not self.applicable:
            return "single arm: no comparison"
        if self.controlled:
            return "controlled comparison (kit compare: only declared factors differ)"
        reasons = "; ".join(r for p in self.pairs for r in p.reasons[:2])
        return f"NOT a controlled comparison: differences are {DESCRIPTIVE_LABEL} ({reasons})"

    def to_json(self) -> dict:
        return {"applicable": self.applicable, "controlled": self.controlled, "label": self.label,
                "headline": self.headline(), "pairs": [p.to_json() for p in self.pairs]}


def _default_compare() -> tuple[Callable | None, str | None]:
    try:
        from kit.compare import compare_run_manifests  # lazy: owned by the comparison module
    except Exception as exc:  # ImportError, or a module that fails to import
        return None, f"kit.compare.compare_run_manifests is not available ({type(exc).__name__})"
    return compare_run_manifests, None


def assess_pair(reference, other, compare: Callable | None = None) -> PairVerdict:
    """Verdict for two ArmLogs (anything with ``.name`` and ``.manifest``)."""
    bare = [a.name for a in (reference, other) if a.manifest is None]
    if bare:
        return PairVerdict(reference.name, other.name, False,
                           tuple(f"{n} has no run manifest (bare log): its software identity is unknown"
                                 for n in bare), ())
    problem = None
    if compare is None:
        compare, problem = _default_compare()
    if compare is None:
        return PairVerdict(reference.name, other.name, False, (problem,), ())
    try:
        result = compare(reference.manifest, other.manifest)
    except Exception as exc:  # a manifest the comparison cannot read is not evidence of control
        return PairVerdict(reference.name, other.name, False,
                           (f"kit compare could not compare the manifests ({type(exc).__name__}: {exc})",), ())
    paths = tuple(str(getattr(d, "path", d)) for d in getattr(result, "uncontrolled", ()) or ())
    if bool(getattr(result, "controlled", False)) and not paths:
        return PairVerdict(reference.name, other.name, True, (), ())
    shown = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
    reason = f"uncontrolled differences: {shown}" if paths else "kit compare reports the runs as not controlled"
    return PairVerdict(reference.name, other.name, False, (reason,), paths)


def assess(arms: Sequence, compare: Callable | None = None) -> Comparability:
    """Each arm after the first against the first; one arm gives a non-applicable verdict."""
    if len(arms) < 2:
        return Comparability(())
    return Comparability(tuple(assess_pair(arms[0], other, compare) for other in arms[1:]))
