"""Claims as documents: sealing, the claim's own hash, binding a run's manifest, the decision rules, the
verdict's hash. Pure over documents (the runs are in tests/cli/test_claim_workflow.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kit.evidence.claims import (INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, binding_problems, claim_problems,
                                 claim_sha256, decide, read_sealed_claim, seal_claim, seal_verdict,
                                 seed_free_arm_sha256, verdict_sha256)
from kit.evidence.signing import generate_private_key
from kit.model.errors import BadInput, CheckFailed

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "claims" / "smoke-mismatch.json"
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
