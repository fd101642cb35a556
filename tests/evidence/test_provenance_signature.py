"""Signed build provenance: `kit verify` checks the DSSE signature next to a statement, and any
changed field, another key or a missing signature (when one is required) exits 1."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from conftest import run_kit
from sealed_run import write_keypair
from kit.evidence.provenance_signature import PAYLOAD_TYPE, envelope_path, sign_provenance
from kit.evidence.signing import load_private_key
from kit.model.documents import canonical_json, dumps_pretty

STATEMENT = {
    "_type": "https://in-toto.io/Statement/v1",
    "subject": [{"name": "rlk-kit/smoke:cpu-0123456789ab@config", "digest": {"sha256": "a" * 64}}],
    "predicateType": "https://slsa.dev/provenance/v1",
    "predicate": {
        "buildDefinition": {"buildType": "https://rlk-kit.dev/build/image/v1",
                            "externalParameters": {"platform": "cpu", "stack": {"name": "smoke", "sha256": "b" * 64}},
                            "resolvedDependencies": [{"name": "lock.json", "digest": {"sha256": "c" * 64}}]},
        "runDetails": {"builder": {"id": "https://rlk-kit.dev/builder/kit-build"}},
    },
}


def signed(tmp_path: Path) -> tuple[Path, Path, Path]:
    priv, pub = write_keypair(tmp_path / "keys")
    path = tmp_path / "builds" / "rlk-kit_smoke_cpu-0123456789ab.provenance.json"
    path.parent.mkdir()
    path.write_text(dumps_pretty(STATEMENT))
    return path, sign_provenance(path, load_private_key(priv)), pub


def verify(*args: str) -> tuple[int, dict]:
    proc = run_kit("verify", "--json", *args)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr}


def test_the_envelope_is_a_dsse_in_toto_envelope_of_the_statement(tmp_path):
    path, envelope_file, _ = signed(tmp_path)
    assert envelope_file == envelope_path(path) and envelope_file.name.endswith(".provenance.dsse.json")
    envelope = json.loads(envelope_file.read_text())
    assert envelope["payloadType"] == PAYLOAD_TYPE == "application/vnd.in-toto+json"
    assert base64.b64decode(envelope["payload"]) == canonical_json(STATEMENT)
    assert len(envelope["signatures"]) == 1 and len(envelope["signatures"][0]["keyid"]) == 64


def test_verify_checks_the_signature_and_the_key(tmp_path):
    path, envelope_file, pub = signed(tmp_path)
    for target in (path, envelope_file):
        rc, doc = verify(str(target))
        assert rc == 0, doc
        assert any(n.startswith("trust signed: signed by ed25519 key") for n in doc["results"][0]["notes"]), doc
    rc, doc = verify("--key", str(pub), str(path))
    assert rc == 0 and any(n.startswith("trust trusted") for n in doc["results"][0]["notes"]), doc
    _, other = write_keypair(tmp_path / "other")
    rc, doc = verify("--key", str(other), str(path))
    assert rc == 1 and "not by the --key" in json.dumps(doc["results"][0]["problems"]), doc


def test_a_changed_field_fails_verification(tmp_path):
    path, envelope_file, _ = signed(tmp_path)
    changed = json.loads(path.read_text())
    changed["predicate"]["buildDefinition"]["externalParameters"]["platform"] = "cuda"
    path.write_text(dumps_pretty(changed))
    rc, doc = verify(str(path))
    assert rc == 1, doc
    assert [p["pointer"] for p in doc["results"][0]["problems"]] == ["/payload", "/signatures/0"], doc
    # The same change made inside the envelope: the signature no longer covers its payload.
    envelope = json.loads(envelope_file.read_text())
    envelope["payload"] = base64.b64encode(canonical_json(changed)).decode()
    envelope_file.write_text(json.dumps(envelope))
    rc, doc = verify(str(envelope_file))
    assert rc == 1 and "edited" in doc["results"][0]["problems"][0]["message"], doc


def test_an_unsigned_statement_passes_unless_a_signature_is_required(tmp_path):
    path, envelope_file, pub = signed(tmp_path)
    envelope_file.unlink()
    rc, doc = verify(str(path))
    assert rc == 0 and "trust unsigned" in doc["results"][0]["notes"][-1], doc
    for flags in (["--require-signature"], ["--key", str(pub)]):
        rc, doc = verify(*flags, str(path))
        assert rc == 1 and "kit build --sign-key" in doc["results"][0]["problems"][0]["message"], doc
