"""Claims as documents: sealing (v1 and v2, criteria), the claim's own hash, binding a run's manifest, the
decision rules, the combination of criteria, the verdict's hash. Pure over documents (the runs are in
tests/cli/test_claim_workflow.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kit.cli.plan import select_arm
from kit.evidence.claims import (INCOMPLETE, INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, binding_problems, claim_problems,
                                 claim_sha256, claim_verdict, decide, read_sealed_claim, seal_claim, seal_verdict,
                                 seed_free_arm_sha256, verdict_criteria, verdict_sha256)
from kit.evidence.signing import generate_private_key
from kit.model.documents import schema_problems
from kit.model.errors import BadInput, CheckFailed
from kit.run.claimed import resolved_arm

CLAIMS = Path(__file__).resolve().parents[2] / "manifests" / "claims"
EXAMPLE = CLAIMS / "smoke-mismatch.json"
GPU_CLAIM = CLAIMS / "gpu-strict-tax.json"
ARM = {"name": "smoke", "operators": {"attention": "R/R"}, "workload": {"seed": 1, "rollout_seed": 1, "rollouts": 2}}
NATIVE = dict(ARM, name="smoke-native", operators={"attention": "P/P"})


def resolve(entry, rollouts):
    arm = NATIVE if entry.get("mode") == "native" else ARM
    return arm["name"], seed_free_arm_sha256(arm)


def sealed(tmp_path, key=None, **changes) -> Path:
    doc = json.loads(EXAMPLE.read_text()) | changes
    path = tmp_path / "claim.sealed.json"
    path.write_text(json.dumps(seal_claim(doc, resolve, key)))
    return path


def test_seal_fills_arms_and_runs_and_hashes_the_rest(tmp_path):
    claim = read_sealed_claim(sealed(tmp_path))
    assert claim.arms["reference"]["name"] == "smoke-native" and claim.arms["treatment"]["name"] == "smoke"
    assert [r.run_id for r in claim.runs][:2] == ["smoke-mismatch-reference-s1", "smoke-mismatch-reference-s2"]
    assert len(claim.runs) == 6 and claim.sha256 == claim_sha256(claim.document)


def test_an_edited_claim_is_refused(tmp_path):
    path = sealed(tmp_path)
    doc = json.loads(path.read_text())
    doc["rule"]["min_tokens"] = 1
    assert any("edited after it was sealed" in m for _, m in claim_problems(doc))
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckFailed, match="edited"):
        read_sealed_claim(path)


def test_a_signed_claim_whose_signature_no_longer_matches_is_refused(tmp_path):
    doc = json.loads(sealed(tmp_path, key=generate_private_key("ed25519")).read_text())
    assert claim_problems(doc) == []
    doc["sealed"]["sealed_at"] = "2020-01-01T00:00:00.000000Z"
    assert any(p == "/sealed/signature" for p, _ in claim_problems(doc))


def test_seal_refuses_a_rule_without_its_parameter_and_a_run_missing_from_the_grid(tmp_path):
    with pytest.raises(BadInput, match="/rule/bound"):
        sealed(tmp_path, rule={"kind": "ratio-upper-bound"})
    runs = [{"run_id": f"r{s}", "role": "reference", "seed": s} for s in (1, 2, 3)]
    with pytest.raises(BadInput, match="one run per arm x seed"):
        sealed(tmp_path, runs=runs)
    with pytest.raises(BadInput, match="counts mismatched tokens"):
        sealed(tmp_path, metric={"name": "step_time_s", "steady_from": 1, "length_control": "none",
                                 "bootstrap": {"scheme": "two-level", "draws": 2000, "seed": 1}})


def test_a_given_arm_sha256_must_be_the_arm_it_resolves_to(tmp_path):
    doc = json.loads(EXAMPLE.read_text())
    doc["arms"]["treatment"]["sha256"] = "0" * 64
    with pytest.raises(CheckFailed, match="/arms/treatment/sha256"):
        seal_claim(doc, resolve)


def manifest_for(claim, run_id="smoke-mismatch-treatment-s2", seed=2, arm=ARM, bound=True):
    arm = copy.deepcopy(arm)
    arm["workload"].update(seed=seed, rollout_seed=seed)
    m = {"run_id": run_id, "arm": arm}
    if bound:
        m["claim"] = {"name": claim.name, "sha256": claim.sha256, "role": "treatment", "seed": seed}
    return m


def test_binding_names_unbound_foreign_and_differing_runs(tmp_path):
    claim = read_sealed_claim(sealed(tmp_path))
    assert binding_problems(claim, manifest_for(claim)) == []
    assert "not bound" in binding_problems(claim, manifest_for(claim, bound=False))[0]
    other = manifest_for(claim)
    other["claim"]["sha256"] = "1" * 64
    assert "another claim" in binding_problems(claim, other)[0]
    assert "none of its declared runs" in binding_problems(claim, manifest_for(claim, run_id="later-remake"))[0]
    assert "seeds 3/3" in binding_problems(claim, manifest_for(claim, seed=3))[0]
    assert "not the claim's treatment arm" in binding_problems(claim, manifest_for(claim, arm=NATIVE))[0]
    longer = copy.deepcopy(ARM)
    longer["workload"]["rollouts"] = 5
    found = binding_problems(claim, manifest_for(claim, arm=longer))
    assert any("5 rollouts" in p for p in found) and any("not the claim's" in p for p in found)


@pytest.mark.parametrize("kind, bound, ci, expected", [
    ("ratio-upper-bound", 1.10, (1.02, 0.98, 1.08), SUPPORTED),
    ("ratio-upper-bound", 1.10, (1.15, 1.12, 1.20), NOT_SUPPORTED),
    ("ratio-upper-bound", 1.10, (1.08, 1.01, 1.16), INCONCLUSIVE),
    ("difference-upper-bound", 0.0, (-3.0, -4.0, -2.0), SUPPORTED),
    ("difference-lower-bound", 0.0, (-3.0, -4.0, -2.0), NOT_SUPPORTED),
    ("difference-lower-bound", 0.0, (3.0, 0.0, 5.0), SUPPORTED),
    ("difference-lower-bound", 0.0, (1.0, -1.0, 5.0), INCONCLUSIVE),
])
def test_interval_rules(kind, bound, ci, expected):
    est, lo, hi = ci
    stat = {"estimate": est, "ci95_low": lo, "ci95_high": hi}
    assert decide({"kind": kind, "bound": bound}, {"difference": stat, "ratio": stat})[0] == expected


@pytest.mark.parametrize("totals, expected", [
    ((0, 40, 10**6), SUPPORTED), ((2, 40, 10**6), NOT_SUPPORTED), ((0, 40, 10), INCONCLUSIVE), ((0, 0, 10**6), INCONCLUSIVE),
])
def test_zero_and_positive(totals, expected):
    t, r, tokens = totals
    stats = {"totals": {"treatment_mismatches": t, "reference_mismatches": r, "treatment_tokens": tokens}}
    assert decide({"kind": "zero-and-positive", "min_tokens": 1000}, stats)[0] == expected


def test_ratio_rule_with_a_zero_reference_is_inconclusive():
    assert decide({"kind": "ratio-upper-bound", "bound": 1.1}, {"ratio": None, "difference": None})[0] == INCONCLUSIVE


def test_verdict_hash_covers_every_field():
    doc = {"schema": "rlk-kit/claim-verdict/v1", "claim": {"name": "c", "sha256": "a" * 64, "path": "c.json",
                                                         "hypothesis": "h", "rule": "r"},
           "verdict": "supported", "reasons": ["x"], "runs": [], "refused": [], "statistics": None,
           "identity": {"provenance": None, "scope": None, "controlled": None, "differences": []},
           "does_not_prove": [], "evaluated_at": "t"}
    sealed_doc = seal_verdict(doc)
    assert sealed_doc["verdict_sha256"] == verdict_sha256(sealed_doc)
    assert verdict_sha256(dict(sealed_doc, verdict="not supported")) != sealed_doc["verdict_sha256"]


# --- claim/v2: several criteria ---------------------------------------------------------------------------

def two_criteria() -> dict:
    """The v1 example as a v2 claim of two criteria over the same runs."""
    doc = json.loads(EXAMPLE.read_text())
    metric, rule = doc.pop("metric"), doc.pop("rule")
    step = {"name": "step_time_s", "steady_from": 1, "length_control": "none", "bootstrap": metric["bootstrap"]}
    doc.update(schema="rlk-kit/claim/v2", criteria=[{"name": "mismatches", "metric": metric, "rule": rule},
               {"name": "step-time", "metric": step, "rule": {"kind": "ratio-upper-bound", "bound": 1.1}}])
    return doc


def test_a_v2_claim_seals_like_a_v1_claim_and_reads_back_its_criteria(tmp_path):
    doc = two_criteria()
    path = tmp_path / "two.sealed.json"
    path.write_text(json.dumps(seal_claim(doc, resolve)))
    claim = read_sealed_claim(path)
    assert claim.document["schema"] == "rlk-kit/claim/v2" and claim.sha256 == claim_sha256(claim.document)
    assert [(c.name, c.metric["name"], c.rule["kind"]) for c in claim.criteria] == [
        ("mismatches", "mismatch_count", "zero-and-positive"), ("step-time", "step_time_s", "ratio-upper-bound")]
    v1 = read_sealed_claim(sealed(tmp_path))          # a v1 claim reads as one criterion named after its metric
    assert v1.document["schema"] == "rlk-kit/claim/v1"
    assert [(c.name, c.rule["kind"]) for c in v1.criteria] == [("mismatch_count", "zero-and-positive")]
    edited = json.loads(path.read_text())
    edited["criteria"][1]["rule"]["bound"] = 1.5
    assert any("edited after it was sealed" in m for _, m in claim_problems(edited))


@pytest.mark.parametrize("change, pointer", [
    (lambda d: d.update(criteria=[]), "/criteria"),
    (lambda d: d["criteria"][1].update(name="mismatches"), "/criteria/1/name"),
    (lambda d: d["criteria"][1].update(rule={"kind": "ratio-upper-bound"}), "/criteria/1/rule/bound"),
    (lambda d: d["criteria"][1].update(rule={"kind": "zero-and-positive", "min_tokens": 1}), "/criteria/1/metric/name"),
    (lambda d: d.update(metric=d["criteria"][0]["metric"]), "/"),          # v1's fields are no v2 field
])
def test_seal_refuses_a_bad_criterion_naming_its_field(change, pointer):
    doc = two_criteria()
    change(doc)
    with pytest.raises(BadInput) as info:
        seal_claim(doc, resolve)
    assert pointer in str(info.value)


@pytest.mark.parametrize("criteria, complete, controlled, expected", [
    ([SUPPORTED, SUPPORTED], True, True, SUPPORTED),
    ([SUPPORTED], True, True, SUPPORTED),
    ([SUPPORTED, NOT_SUPPORTED], True, True, NOT_SUPPORTED),
    ([INCONCLUSIVE, NOT_SUPPORTED], True, True, NOT_SUPPORTED),       # one criterion fails: the claim fails
    ([SUPPORTED, INCONCLUSIVE], True, True, INCONCLUSIVE),
    ([INCONCLUSIVE, INCONCLUSIVE], True, True, INCONCLUSIVE),
    ([SUPPORTED, SUPPORTED], True, False, INCONCLUSIVE),              # an uncontrolled pair decides nothing
    ([NOT_SUPPORTED, SUPPORTED], True, False, INCONCLUSIVE),
    ([SUPPORTED, SUPPORTED], False, True, INCOMPLETE),                # runs missing, failed or refused
    ([INCOMPLETE, INCOMPLETE], True, None, INCOMPLETE),
])
def test_the_claim_verdict_combines_its_criteria(criteria, complete, controlled, expected):
    assert claim_verdict(criteria, complete=complete, controlled=controlled) == expected


def test_a_claim_without_criteria_has_no_verdict():
    with pytest.raises(ValueError):
        claim_verdict([])


def test_a_v1_verdict_reads_as_one_criterion():
    claim = json.loads(EXAMPLE.read_text())
    doc = {"schema": "rlk-kit/claim-verdict/v1", "claim": {"name": "c", "sha256": "a" * 64, "path": "c.json",
                                                         "hypothesis": "h", "rule": "r"},
           "verdict": "supported", "reasons": ["x"], "statistics": {"metric": "mismatch_count"}}
    (one,) = verdict_criteria(doc, claim)
    assert (one["name"], one["rule"]["kind"], one["rule_text"], one["verdict"]) == ("mismatch_count", "zero-and-positive",
                                                                                   "r", "supported")


def test_the_gpu_claim_validates_and_seals(tmp_path):
    doc = json.loads(GPU_CLAIM.read_text())
    assert doc["schema"] == "rlk-kit/claim/v2" and "sealed" not in doc and schema_problems(doc, "claim") == []
    assert [(c["name"], c["metric"]["name"], c["rule"]) for c in doc["criteria"]] == [
        ("step-time", "step_time_s", {"kind": "ratio-upper-bound", "bound": 1.10}),
        ("mismatches", "mismatch_count", {"kind": "zero-and-positive", "min_tokens": 1000000})]
    resolved = {}

    def catalog_resolve(entry, rollouts):        # kit claim seal's own resolution: the catalog, nothing of a GPU host
        resolved[entry["arm"]] = rollouts
        return resolved_arm(select_arm(entry["arm"], entry.get("mode")), rollouts)

    path = tmp_path / "gpu.sealed.json"
    path.write_text(json.dumps(seal_claim(doc, catalog_resolve)))
    claim = read_sealed_claim(path)
    assert resolved == {"gpu-native": 20, "gpu-consistency": 20} and len(claim.runs) == 6
    assert claim.runs[0].run_id == "gpu-strict-tax-reference-s1"
    assert (claim.arms["reference"]["name"], claim.arms["treatment"]["name"]) == ("gpu-native", "gpu-consistency")
