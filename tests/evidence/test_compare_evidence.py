"""kit compare re-verifies both run dirs, states each one's trust level, and holds runs judged by
different gate sets to be no controlled comparison unless the user accepts it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from click.testing import CliRunner

from kit.cli import cli
from kit.evidence import bundle as E
from sealed_run import write_keypair

from conftest import run_manifest, seal_test_run


def sealed(ws: Path, run_id: str, *, gate_set: str = "rlk-kit-gates/2", sign_key: Path | None = None) -> Path:
    run_dir = E.create_run_dir(ws, run_id)
    E.write_document(run_dir, E.MANIFEST, run_manifest("smoke", run_id))
    E.write_new_text(run_dir, E.RUN_LOG, "step 0: {}\n")
    seal_test_run(run_dir, run_id, gate_set_version=gate_set, sign_key=sign_key)
    return run_dir


def compare(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(cli, ["compare", "--json", *args])
    return result.exit_code, json.loads(result.stdout) if result.stdout.startswith("{") else result.output


def test_two_verified_runs_are_controlled_and_state_their_trust(tmp_path):
    a, b = sealed(tmp_path, "a"), sealed(tmp_path, "b")
    code, doc = compare(str(a), str(b))
    assert code == 0 and doc["controlled"], doc
    assert doc["schema"] == "rlk-kit/comparison/v4"
    assert [(e["verified"], e["trust"]) for e in doc["evidence"]] == [(True, "unsigned"), (True, "unsigned")]


def test_a_forged_verdict_in_the_seal_is_caught_by_re_verification(tmp_path):
    a, b = sealed(tmp_path, "a"), sealed(tmp_path, "b")
    seal = json.loads((b / E.SEAL).read_text())
    seal["gate_set_version"] = "rlk-kit-gates/2"          # same value, but any field edit breaks seal_sha256
    seal["sealed_at"] = "2020-01-01T00:00:00.000000Z"
    (b / E.SEAL).chmod(0o644)
    (b / E.SEAL).write_text(json.dumps(seal, indent=2, sort_keys=True) + "\n")
    code, doc = compare(str(a), str(b))
    assert code == 1 and not doc["controlled"]
    assert "kit verify fails" in doc["not_comparable"][0]["reason"] and "seal_sha256" in doc["not_comparable"][0]["reason"]


def test_a_changed_artifact_makes_the_pair_not_controlled(tmp_path):
    a, b = sealed(tmp_path, "a"), sealed(tmp_path, "b")
    log = b / E.RUN_LOG
    log.chmod(log.stat().st_mode | stat.S_IWUSR)
    log.write_text("step 0: {'x': 1}\n")
    code, doc = compare(str(a), str(b))
    assert code == 1 and doc["evidence"][1]["verified"] is False


def test_different_gate_sets_are_uncontrolled_unless_accepted(tmp_path):
    a, b = sealed(tmp_path, "a"), sealed(tmp_path, "b", gate_set="rlk-kit-gates/3")
    code, doc = compare(str(a), str(b))
    assert code == 1 and [d["path"] for d in doc["differences"]] == ["validation.gate_set_version"]
    assert doc["differences"][0]["status"] == "uncontrolled"
    code, doc = compare("--accept-gate-sets", str(a), str(b))
    assert code == 0 and doc["differences"][0]["status"] == "declared", doc


def test_signature_policy(tmp_path):
    priv, pub = write_keypair(tmp_path / "keys")
    _, other_pub = write_keypair(tmp_path / "other")
    a, b = sealed(tmp_path / "ws", "a", sign_key=priv), sealed(tmp_path / "ws", "b", sign_key=priv)
    unsigned = sealed(tmp_path / "ws", "c")
    code, doc = compare("--key", str(pub), str(a), str(b))
    assert code == 0 and [e["trust"] for e in doc["evidence"]] == ["trusted", "trusted"]
    assert compare("--key", str(other_pub), str(a), str(b))[0] == 1
    assert compare("--require-signature", str(a), str(unsigned))[0] == 1
    assert compare(str(a), str(unsigned))[1]["evidence"][0]["trust"] == "signed"


def test_kit_analyze_names_different_gate_sets(tmp_path):
    from kit.analysis.comparability import assess_pair

    a, b = sealed(tmp_path, "a"), sealed(tmp_path, "b", gate_set="rlk-kit-gates/3")

    class Arm:
        def __init__(self, run_dir):
            self.name, self.run_dir, self.manifest, self.evidence_problems = run_dir.name, run_dir, E.read_manifest(run_dir), ()

    verdict = assess_pair(Arm(a), Arm(b))
    assert not verdict.controlled and any("different gate sets" in r for r in verdict.reasons)
    assert assess_pair(Arm(a), Arm(b), accept_gate_sets=True).controlled
