"""Claims: a test declared and sealed before its runs, and the sealed verdict of evaluating it.

A claim (``rlk-kit/claim/v2``) states a hypothesis, the two arms (by name and seed-free arm sha256),
the runs it will use (arm x seed, by run id), its criteria (each a named metric with every analysis
option fixed and its decision rule) and what counts as inconclusive; a ``rlk-kit/claim/v1`` claim (one
``metric`` and one ``rule``) reads as a claim of one criterion, named after its metric. ``kit claim
seal`` adds ``sealed``: the sha256 of the rest (and a signature with ``--sign-key``), the same way for
both versions. ``kit run --claim`` writes that sha256 into each run's manifest, so a bound run provably
started after the claim existed. A verdict (``rlk-kit/claim-verdict/v2``; v1 verdicts still verify)
names the claim, each criterion's result, the runs (by seal sha256) and the kit version, and is sealed
by its own sha256. Rules here are pure over documents, except :func:`verdict_problems`, which
re-verifies the runs a verdict counted. Example::

    claim = read_sealed_claim(Path("claims/smoke.sealed.json"))
    binding_problems(claim, read_manifest(Path("ws/runs/smoke-mismatch-treatment-s1")))   # [] when bound
    decide(claim.criteria[0].rule, {"difference": {"estimate": -40.0, "ci95_low": -50.0, "ci95_high": -30.0}})
    claim_verdict([SUPPORTED, INCONCLUSIVE])                                               # 'inconclusive'
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from kit import __version__
from kit.evidence.audit import verify_run_dir
from kit.evidence.bundle import SEAL, utc_now
from kit.evidence.signing import seal_trust, sign_seal
from kit.model.documents import read_json_file, require_valid, schema_id, schema_problems, sha256_of_document
from kit.model.errors import BadInput, CheckFailed, KitError

CLAIM_SCHEMAS = (schema_id("claim", 1), schema_id("claim", 2))
VERDICT_SCHEMA = schema_id("claim-verdict", 2)           # what kit claim evaluate writes
VERDICT_SCHEMAS = (schema_id("claim-verdict", 1), VERDICT_SCHEMA)
ROLES = ("reference", "treatment")
SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, INCOMPLETE = "supported", "not supported", "inconclusive", "incomplete"
CLAIM_PAYLOAD = "application/vnd.rlk-kit.claim+json"
VERDICT_PAYLOAD = "application/vnd.rlk-kit.claim-verdict+json"
# What a supported verdict never shows, whatever the claim: stated in every verdict.
DOES_NOT_PROVE = (
    "that the claim holds beyond the declared arms, seeds, rollouts and host: it is one test of one hypothesis",
    "that the runs ran the stack's pinned software, unless identity.provenance says pinned",
    "anything about a metric, window or statistic other than the ones the claim fixed before its runs",
)


@dataclass(frozen=True)
class DeclaredRun:
    run_id: str
    role: str
    seed: int


@dataclass(frozen=True)
class Criterion:
    """One thing a claim states: a metric with its analysis options fixed, and the rule that decides it."""

    name: str
    metric: dict
    rule: dict


@dataclass(frozen=True)
class Claim:
    """A sealed claim as read back (``document`` is the file's JSON, ``sha256`` its claim_sha256)."""

    name: str
    hypothesis: str
    arms: dict                  # role -> {"arm", "mode", "name", "sha256"}
    seeds: tuple[int, ...]
    rollouts: int
    runs: tuple[DeclaredRun, ...]
    criteria: tuple[Criterion, ...]
    inconclusive: str
    sha256: str
    path: str
    document: dict

    def role_of_arm(self, name: str) -> str | None:
        return next((r for r in ROLES if self.arms[r]["name"] == name), None)


def claim_criteria(doc: dict) -> list[dict]:
    """The claim's criteria as ``{"name", "metric", "rule"}``: a v2 claim's ``criteria``, or a v1 claim's
    one metric and rule as one criterion named after its metric."""
    if "criteria" in doc:
        return doc["criteria"]
    return [{"name": doc["metric"]["name"], "metric": doc["metric"], "rule": doc["rule"]}]


def claim_body(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "sealed"}


def claim_sha256(doc: dict) -> str:
    """sha256 of the canonical JSON of the claim without ``sealed``: what ``kit run --claim`` binds to (v1 and v2
    alike: the document as written, whatever its version)."""
    return sha256_of_document(claim_body(doc))


def seed_free_arm_sha256(arm_doc: dict) -> str:
    """sha256 of a run's arm document with ``workload.seed`` and ``workload.rollout_seed`` removed: the
    same for every replicate of one arm, different for any other change (operators, rollouts, topology)."""
    doc = copy.deepcopy(arm_doc)
    workload = doc.get("workload") if isinstance(doc.get("workload"), dict) else {}
    for key in ("seed", "rollout_seed"):
        workload.pop(key, None)
    return sha256_of_document(doc)


def rule_text(rule: dict, metric: dict) -> str:
    """The decision rule in words, e.g. ``supported when the upper 95 % CI bound of treatment ÷ reference
    mean step_time_s is ≤ 1.1; not supported when the lower bound is above it``."""
    m = f"mean {metric['name']}" + (" per 1k response tokens" if metric.get("length_control") == "per-1k-response-tokens" else "")
    kind, bound = rule["kind"], rule.get("bound")
    if kind == "ratio-upper-bound":
        return (f"supported when the upper 95 % CI bound of treatment ÷ reference {m} is ≤ {bound:g}; not supported "
                "when its lower bound is above it; inconclusive otherwise")
    if kind == "difference-upper-bound":
        return (f"supported when the upper 95 % CI bound of treatment − reference {m} is ≤ {bound:g}; not supported "
                "when its lower bound is above it; inconclusive otherwise")
    if kind == "difference-lower-bound":
        return (f"supported when the lower 95 % CI bound of treatment − reference {m} is ≥ {bound:g}; not supported "
                "when its upper bound is below it; inconclusive otherwise")
    return (f"supported when the treatment has 0 mismatched tokens over ≥ {rule.get('min_tokens', 0):,} compared "
            "tokens and the reference more than 0; not supported when the treatment has any; inconclusive otherwise")


def _rule_problems(metric: dict, rule: dict, at: str = "") -> list[tuple[str, str]]:
    if rule.get("kind") == "zero-and-positive":
        out = [] if metric["name"] == "mismatch_count" else [
            (f"{at}/metric/name", f"{metric['name']}: the zero-and-positive rule counts mismatched tokens; use mismatch_count")]
        return out + ([] if "min_tokens" in rule else [(f"{at}/rule/min_tokens", "missing: how many compared tokens the treatment needs")])
    return [] if isinstance(rule.get("bound"), (int, float)) else [(f"{at}/rule/bound", f"missing: the {rule.get('kind')} rule needs a bound")]


def _criteria_problems(doc: dict) -> list[tuple[str, str]]:
    """Each criterion's rule against its metric, and names unique (pointers as in the document: /criteria/<i>/…
    for v2, /metric and /rule for v1)."""
    if "criteria" not in doc:
        return _rule_problems(doc["metric"], doc["rule"])
    out, seen = [], {}
    for i, c in enumerate(doc["criteria"]):
        out += _rule_problems(c["metric"], c["rule"], f"/criteria/{i}")
        if c["name"] in seen:
            out.append((f"/criteria/{i}/name", f"{c['name']!r} is also the name of /criteria/{seen[c['name']]}: each "
                                               "criterion needs its own name"))
        seen.setdefault(c["name"], i)
    return out


def declared_runs(doc: dict) -> list[dict]:
    """The claim's runs, or the default ``<name>-<role>-s<seed>`` for every role x seed."""
    if doc.get("runs"):
        return doc["runs"]
    return [{"run_id": f"{doc['name']}-{role}-s{seed}", "role": role, "seed": seed} for role in ROLES for seed in doc["seeds"]]


def _runs_problems(doc: dict) -> list[tuple[str, str]]:
    runs = declared_runs(doc)
    want = {(role, seed) for role in ROLES for seed in doc["seeds"]}
    have = [(r["role"], r["seed"]) for r in runs]
    out = []
    if sorted(have) != sorted(want):
        out.append(("/runs", f"must name one run per arm x seed ({len(want)}: roles {', '.join(ROLES)} x seeds "
                             f"{doc['seeds']}), found {len(have)}"))
    ids = [r["run_id"] for r in runs]
    if len(set(ids)) != len(ids):
        out.append(("/runs", "a run id is given twice: each declared run needs its own"))
    return out


def seal_claim(doc: dict, resolve_arm, private_key=None) -> dict:
    """The sealed claim: arms resolved by ``resolve_arm(entry, rollouts) -> (name, seed-free sha256)``
    (a given name or sha256 must match), runs filled in, ``sealed`` added. BadInput names what is wrong."""
    require_valid(doc, "claim", "claim")
    if "sealed" in doc:
        raise BadInput("claim: already sealed (it has 'sealed'); seal the claim document you wrote")
    problems = _criteria_problems(doc) + _runs_problems(doc)
    if problems:
        raise BadInput("claim: " + "; ".join(f"{p}: {m}" for p, m in problems))
    out = copy.deepcopy(doc)
    for role in ROLES:
        entry = out["arms"][role]
        name, sha = resolve_arm(entry, doc["rollouts"])
        for key, value in (("name", name), ("sha256", sha)):
            if key in entry and entry[key] != value:
                raise CheckFailed(f"claim: /arms/{role}/{key} is {entry[key]}, but arm {entry['arm']} "
                                  f"(mode {entry.get('mode')}) resolves to {value}")
            entry[key] = value
    if out["arms"]["reference"]["sha256"] == out["arms"]["treatment"]["sha256"]:
        raise BadInput("claim: /arms: reference and treatment are the same arm; a claim compares two")
    out["runs"] = declared_runs(out)
    sealed = {"sealed_at": utc_now(), "kit_version": __version__, "claim_sha256": claim_sha256(out)}
    if private_key is not None:
        sealed["signature"] = sign_seal(sealed, private_key, CLAIM_PAYLOAD)
    out["sealed"] = sealed
    return require_valid(out, "sealed claim", "claim")


def claim_problems(doc: dict) -> list[tuple[str, str]]:
    """What is wrong with a sealed claim document as it is now: schema, rules, its own sha256, signature."""
    problems = schema_problems(doc, "claim")
    if problems:
        return problems
    problems = _criteria_problems(doc) + _runs_problems(doc)
    sealed = doc.get("sealed")
    if sealed is None:
        return problems + [("/sealed", "missing: the claim is not sealed; kit claim seal FILE seals it")]
    if sealed["claim_sha256"] != claim_sha256(doc):
        problems.append(("/sealed/claim_sha256", f"{sealed['claim_sha256'][:16]}… does not match the claim's content "
                                                 f"({claim_sha256(doc)[:16]}…): the claim was edited after it was sealed"))
    if "signature" in sealed:
        problems += [("/sealed/signature", m) for m in seal_trust(sealed)[2]]
    return problems


def read_sealed_claim(path: Path, flag: str = "CLAIM") -> Claim:
    """A sealed claim that checks out; BadInput (exit 2) for an unsealed or unreadable file, CheckFailed
    (exit 1) for one edited after sealing."""
    path = Path(path)
    try:
        doc = read_json_file(path)
    except KitError as exc:
        raise BadInput(f"{flag} {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") not in CLAIM_SCHEMAS:
        raise BadInput(f"{flag} {path}: not a {' or '.join(CLAIM_SCHEMAS)} document")
    if "sealed" not in doc:
        raise BadInput(f"{flag} {path}: not sealed; run kit claim seal {path} first")
    problems = claim_problems(doc)
    if problems:
        raise CheckFailed(f"{flag} {path}: " + "; ".join(f"{p}: {m}" for p, m in problems))
    runs = tuple(DeclaredRun(r["run_id"], r["role"], r["seed"]) for r in doc["runs"])
    criteria = tuple(Criterion(c["name"], c["metric"], c["rule"]) for c in claim_criteria(doc))
    return Claim(doc["name"], doc["hypothesis"], {r: dict(doc["arms"][r]) for r in ROLES}, tuple(doc["seeds"]),
                 doc["rollouts"], runs, criteria, doc["inconclusive"], doc["sealed"]["claim_sha256"], str(path), doc)


def binding_record(claim: Claim, run_id: str) -> dict:
    """The manifest's ``claim`` of a declared run; BadInput when the claim declares no such run."""
    run = next((r for r in claim.runs if r.run_id == run_id), None)
    if run is None:
        raise BadInput(f"--claim {claim.path}: declares no run {run_id} (it declares {', '.join(r.run_id for r in claim.runs)})")
    return {"name": claim.name, "sha256": claim.sha256, "role": run.role, "seed": run.seed}


def binding_problems(claim: Claim, manifest: dict) -> list[str]:
    """Why a run's manifest is no run of this claim ([] when it is a declared run, bound, of the declared
    arm, seed and rollouts)."""
    bound = manifest.get("claim")
    run_id = manifest.get("run_id")
    if not isinstance(bound, dict):
        return [f"run {run_id} is not bound to claim {claim.name}: it was made without kit run --claim "
                "(before the claim existed or outside it)"]
    if bound.get("sha256") != claim.sha256:
        return [f"run {run_id} is bound to another claim ({bound.get('name')}, {str(bound.get('sha256'))[:16]}…)"]
    declared = next((r for r in claim.runs if r.run_id == run_id), None)
    if declared is None:
        return [f"run {run_id} is bound to claim {claim.name} but is none of its declared runs"]
    arm = manifest.get("arm") if isinstance(manifest.get("arm"), dict) else {}
    workload = arm.get("workload") if isinstance(arm.get("workload"), dict) else {}
    want = claim.arms[declared.role]
    out = []
    if arm.get("name") != want["name"] or seed_free_arm_sha256(arm) != want["sha256"]:
        out.append(f"run {run_id}: arm {arm.get('name')} ({seed_free_arm_sha256(arm)[:12]}…) is not the claim's "
                   f"{declared.role} arm {want['name']} ({want['sha256'][:12]}…)")
    if workload.get("seed") != declared.seed or workload.get("rollout_seed") != declared.seed:
        out.append(f"run {run_id}: seeds {workload.get('seed')}/{workload.get('rollout_seed')}, the claim declares {declared.seed}")
    if workload.get("rollouts") != claim.rollouts:
        out.append(f"run {run_id}: {workload.get('rollouts')} rollouts, the claim declares {claim.rollouts}")
    return out


def decide(rule: dict, stats: dict) -> tuple[str, str]:
    """``(verdict, why)`` from the rule and the statistics the claim fixed (pure). ``stats``:
    ``{"difference": {...}, "ratio": {...}}`` with ``estimate``, ``ci95_low``, ``ci95_high``; for the
    zero-and-positive rule ``{"totals": {"treatment_mismatches", "reference_mismatches", "treatment_tokens"}}``."""
    kind = rule["kind"]
    if kind == "zero-and-positive":
        t = stats["totals"]
        if t["treatment_mismatches"] > 0:
            return NOT_SUPPORTED, f"the treatment has {t['treatment_mismatches']:g} mismatched tokens (the rule needs 0)"
        if t["treatment_tokens"] < rule["min_tokens"]:
            return INCONCLUSIVE, (f"0 mismatched tokens, but over {t['treatment_tokens']:,.0f} compared tokens, fewer than "
                                  f"the {rule['min_tokens']:,} the claim needs")
        if t["reference_mismatches"] <= 0:
            return INCONCLUSIVE, "the reference has no mismatched tokens either: the test cannot tell the arms apart"
        return SUPPORTED, (f"the treatment has 0 mismatched tokens over {t['treatment_tokens']:,.0f} compared tokens; the "
                           f"reference {t['reference_mismatches']:g}")
    s = stats["ratio" if kind == "ratio-upper-bound" else "difference"]
    if s is None:
        return INCONCLUSIVE, "the statistic is undefined (the reference mean is 0)"
    lo, hi, bound = s["ci95_low"], s["ci95_high"], rule["bound"]
    ci = f"{s['estimate']:.6g} [95 % CI {lo:.6g}, {hi:.6g}]"
    if kind == "difference-lower-bound":
        if lo >= bound:
            return SUPPORTED, f"{ci}: the lower bound is ≥ {bound:g}"
        if hi < bound:
            return NOT_SUPPORTED, f"{ci}: the upper bound is below {bound:g}"
        return INCONCLUSIVE, f"{ci}: the interval contains {bound:g}"
    if hi <= bound:
        return SUPPORTED, f"{ci}: the upper bound is ≤ {bound:g}"
    if lo > bound:
        return NOT_SUPPORTED, f"{ci}: the lower bound is above {bound:g}"
    return INCONCLUSIVE, f"{ci}: the interval contains {bound:g}"


def claim_verdict(criteria: list[str], *, complete: bool = True, controlled: bool | None = True) -> str:
    """The claim's verdict from its criteria's sub-verdicts (pure): incomplete when its runs are (or a
    criterion is); else inconclusive when the pair is not controlled; else supported when every criterion
    is supported, not supported when at least one is not, inconclusive otherwise."""
    if not criteria:
        raise ValueError("a claim has at least one criterion")
    if not complete or INCOMPLETE in criteria:
        return INCOMPLETE
    if not controlled:
        return INCONCLUSIVE
    if all(v == SUPPORTED for v in criteria):
        return SUPPORTED
    return NOT_SUPPORTED if NOT_SUPPORTED in criteria else INCONCLUSIVE


# --- the verdict ------------------------------------------------------------------------------------------

def verdict_sha256(doc: dict) -> str:
    return sha256_of_document({k: v for k, v in doc.items() if k not in ("verdict_sha256", "signature")})


def seal_verdict(doc: dict, private_key=None) -> dict:
    out = dict(doc, kit_version=__version__)
    out["verdict_sha256"] = verdict_sha256(out)
    if private_key is not None:
        out["signature"] = sign_seal({"verdict_sha256": out["verdict_sha256"]}, private_key, VERDICT_PAYLOAD)
    return require_valid(out, "claim verdict", "claim-verdict")


def verdict_problems(path: Path, doc: dict, verify_run) -> tuple[list[tuple[str, str]], list[str]]:
    """``(problems, notes)`` of a verdict as it is now: its own sha256 and signature, the claim it names
    (read again, its sha256 held to the verdict's), and each counted run (``verify_run(dir)`` -> FileVerdict,
    its seal's sha256 held to the one the verdict counted). An edited verdict, an edited claim or a run
    swapped for another is a problem."""
    problems = schema_problems(doc, "claim-verdict")
    if problems:
        return problems, []
    notes = []
    if doc["verdict_sha256"] != verdict_sha256(doc):
        problems.append(("/verdict_sha256", "does not match the verdict's content: the verdict was edited"))
    if "signature" in doc:
        signed = {"verdict_sha256": doc["verdict_sha256"], "signature": doc["signature"]}
        problems += [("/signature", m) for m in seal_trust(signed)[2]]
    claim_path = _beside(path, doc["claim"]["path"])
    try:
        claim_doc = read_json_file(claim_path)
        found = claim_problems(claim_doc) if isinstance(claim_doc, dict) else [("", "not a claim")]
        problems += [(f"/claim ({claim_path}){p}", m) for p, m in found]
        if not found and claim_doc["sealed"]["claim_sha256"] != doc["claim"]["sha256"]:
            problems.append(("/claim/sha256", f"{claim_path} is another claim ({claim_doc['sealed']['claim_sha256'][:16]}…)"))
    except KitError as exc:
        problems.append(("/claim/path", f"{claim_path}: cannot read the claim ({exc})"))
    for i, run in enumerate(doc["runs"]):
        if run["status"] != "counted":
            continue
        run_dir = _beside(path, run["run_dir"])
        checked = verify_run(run_dir)
        problems += [(f"/runs/{i} ({run['run_id']}){p}", m) for p, m in checked.problems]
        try:
            now = sha256_of_document(read_json_file(run_dir / SEAL))
        except KitError as exc:
            problems.append((f"/runs/{i}/seal_sha256", f"{run_dir}: {exc}"))
            continue
        if now != run["seal_sha256"]:
            problems.append((f"/runs/{i}/seal_sha256", f"{run_dir} holds another run now (seal {now[:16]}…, the verdict "
                                                       f"counted {run['seal_sha256'][:16]}…): the runs were swapped"))
    notes.append(f"verdict {doc['verdict']} of claim {doc['claim']['name']} ({doc['claim']['sha256'][:16]}…), "
                 f"{sum(r['status'] == 'counted' for r in doc['runs'])} runs re-verified, kit {doc['kit_version']}")
    return problems, notes


def _beside(path: Path, recorded: str) -> Path:
    """A recorded path as written (absolute) or relative to the verdict's folder."""
    p = Path(recorded)
    return p if p.is_absolute() else Path(path).resolve().parent / p


def claim_verification(path: Path, doc: dict) -> tuple[list[tuple[str, str]], list[str]]:
    """``kit verify`` of a claim or a verdict document: ``(problems, notes)``."""
    if doc.get("schema") in VERDICT_SCHEMAS:
        return verdict_problems(path, doc, verify_run_dir)
    problems = claim_problems(doc)
    if not problems:
        return [], [f"sealed claim {doc['name']} ({doc['sealed']['claim_sha256'][:16]}…), "
                    f"{len(doc['runs'])} declared runs, sealed {doc['sealed']['sealed_at']}"]
    return problems, []


def paths_relative_to(doc: dict, folder: Path) -> dict:
    """The verdict with its claim path and run dirs written relative to ``folder`` (where the verdict is
    written), so a copied tree of verdict, claim and workspace checks its own files."""
    import os

    def rel(p):
        return p if p is None else os.path.relpath(Path(p).resolve(), Path(folder).resolve())

    out = copy.deepcopy(doc)
    out["claim"]["path"] = rel(out["claim"]["path"])
    for run in out["runs"]:
        run["run_dir"] = rel(run["run_dir"])
    return out


def verdict_criteria(doc: dict, claim_doc: dict | None = None) -> list[dict]:
    """A verdict's per-criterion results, ``{"name", "metric", "rule", "rule_text", "statistics", "verdict",
    "reasons"}`` each: a v2 verdict's ``criteria``; a v1 verdict's one statistic and rule as one criterion
    (its metric and rule objects from ``claim_doc``, the claim it names, when given)."""
    if "criteria" in doc:
        return doc["criteria"]
    first = claim_criteria(claim_doc)[0] if isinstance(claim_doc, dict) and ("metric" in claim_doc or "criteria" in claim_doc) else {}
    stats = doc.get("statistics")
    name = first.get("name") or (stats or {}).get("metric") or "criterion"
    return [{"name": name, "metric": first.get("metric", {}), "rule": first.get("rule", {}), "rule_text": doc["claim"]["rule"],
             "statistics": stats, "verdict": doc["verdict"], "reasons": doc["reasons"]}]
