"""Is a set of runs a controlled comparison? Only the run manifests can say so.

For every arm against the reference (the first arm), both runs need a ``manifest.json`` in a run
dir that verifies (sealed, every artifact unchanged, gates passed, manifest valid: what
``kit verify`` checks), and ``kit.compare.compare_run_manifests(a, b)`` must report ``.controlled``.
A bare log, a run dir that fails verification, a missing comparison function or any uncontrolled
difference makes the pair NOT controlled, with the reason; then every number that compares the arms
is labelled descriptive, not causal. Example::

    verdict = assess(arms)
    verdict.controlled          # False for bare logs
    verdict.label               # "descriptive, not causal"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from kit.evidence.compare import PINNED, SAME_HOST, compare_run_manifests, gate_set_of

CONTROLLED_LABEL = "controlled comparison"
DESCRIPTIVE_LABEL = "descriptive, not causal"
HEADLINE_REASONS = 3   # reasons a headline names before 'and N more'


@dataclass(frozen=True)
class PairVerdict:
    reference: str
    other: str
    controlled: bool
    reasons: tuple[str, ...]        # why not controlled; empty when controlled
    uncontrolled_paths: tuple[str, ...]
    # kit compare's provenance of identity (pinned | same-host), None when it could not say; and what the
    # verdict is evidence about. Told in the headline (the analysis documents' pairs carry no such field).
    provenance: str | None = None
    scope: str = ""

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

    @property
    def provenance(self) -> str | None:
        """pinned when every pair is, same-host when any pair is not, None when no pair could say."""
        found = [p.provenance for p in self.pairs]
        if not found or None in found:
            return None
        return PINNED if all(f == PINNED for f in found) else SAME_HOST

    def pair(self, other: str) -> PairVerdict | None:
        return next((p for p in self.pairs if p.other == other), None)

    def headline(self) -> str:
        """One line for CLI text, CSVs and figure subtitles."""
        if not self.applicable:
            return "single arm: no comparison"
        if self.controlled:
            scopes = "; ".join(dict.fromkeys(p.scope for p in self.pairs if p.scope))
            return ("controlled comparison (kit compare: only declared factors differ)"
                    + (f", {scopes}" if scopes else ""))
        # the first reasons only: the line goes into figure subtitles; pairs[].reasons keeps them all
        distinct = list(dict.fromkeys(r for p in self.pairs for r in p.reasons))
        shown = "; ".join(distinct[:HEADLINE_REASONS])
        more = f"; and {len(distinct) - HEADLINE_REASONS} more" if len(distinct) > HEADLINE_REASONS else ""
        return f"NOT a controlled comparison: differences are {DESCRIPTIVE_LABEL} ({shown}{more})"

    def to_json(self) -> dict:
        return {"applicable": self.applicable, "controlled": self.controlled, "label": self.label,
                "headline": self.headline(), "pairs": [p.to_json() for p in self.pairs]}


def run_reasons(arm, who: str | None = None, shown: int = 3) -> tuple[str, ...]:
    """Why one run cannot vouch for its side of a comparison: no manifest, or a run dir that fails
    verification (``arm.evidence_problems``); empty for a run dir that verifies. ``who`` names the
    run in the reason (default: its arm name)."""
    who = who or arm.name
    if arm.manifest is None:
        return (f"{who} has no run manifest and no seal (bare log): its software identity is unknown",)
    problems = tuple(getattr(arm, "evidence_problems", ()) or ())
    if not problems:
        return ()
    listed = "; ".join(problems[:shown]) + (f"; and {len(problems) - shown} more" if len(problems) > shown else "")
    return (f"{who}: kit verify {arm.run_dir} fails ({listed}): its manifest is not evidence",)


def assess_pair(reference, other, compare: Callable | None = None, pooled: Sequence = (), *,
                accept_gate_sets: bool = False) -> PairVerdict:
    """Verdict for two ArmLogs (anything with ``.name``, ``.manifest`` and ``.evidence_problems``).

    ``pooled`` are further runs summarised under either name (convergence): their evidence counts too."""
    reasons = [*run_reasons(reference), *run_reasons(other)]
    gates = [gate_set_of(arm.run_dir) if getattr(arm, "run_dir", None) else None for arm in (reference, other)]
    if None not in gates and gates[0] != gates[1] and not accept_gate_sets:
        reasons.append(f"judged by different gate sets ({gates[0]} vs {gates[1]}): their verdicts are not comparable "
                       "(--accept-gate-sets accepts it)")
    for run in pooled:  # runs that share a name are told apart by where they were read from
        reasons += run_reasons(run, f"{run.name} (pooled run {run.run_dir or run.log_path})")
    evidence = tuple(dict.fromkeys(reasons))
    if reference.manifest is None or other.manifest is None:
        return PairVerdict(reference.name, other.name, False, evidence, ())
    compare = compare or compare_run_manifests
    try:
        result = compare(reference.manifest, other.manifest)
    except Exception as exc:  # a manifest the comparison cannot read is not evidence of control
        return PairVerdict(reference.name, other.name, False,
                           (f"kit compare could not compare the manifests ({type(exc).__name__}: {exc})",) + evidence,
                           ())
    paths = tuple(str(getattr(d, "path", d)) for d in getattr(result, "uncontrolled", ()) or ())
    provenance = getattr(result, "provenance", None)
    scope = result.scope() if callable(getattr(result, "scope", None)) else ""
    if bool(getattr(result, "controlled", False)) and not paths:
        return PairVerdict(reference.name, other.name, not evidence, evidence, (), provenance, scope)
    shown = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
    reason = f"uncontrolled differences: {shown}" if paths else "kit compare reports the runs as not controlled"
    # what kit compare says first, then what the runs' evidence cannot vouch for
    return PairVerdict(reference.name, other.name, False, (reason,) + evidence, paths, provenance, scope)


def assess(arms: Sequence, compare: Callable | None = None, pooled: Mapping[str, Sequence] | None = None, *,
           accept_gate_sets: bool = False) -> Comparability:
    """Each arm after the first against the first; one arm gives a non-applicable verdict.

    ``pooled`` maps an arm name to the other runs summarised under that name (kit analyze convergence)."""
    if len(arms) < 2:
        return Comparability(())
    pooled = pooled or {}
    ref = arms[0]
    return Comparability(tuple(
        assess_pair(ref, other, compare, (*pooled.get(ref.name, ()), *pooled.get(other.name, ())),
                    accept_gate_sets=accept_gate_sets)
        for other in arms[1:]))
