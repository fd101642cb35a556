"""A signed run's attestations (attestation.dsse.json, model.sig) as the kit writes and checks them, ECDSA P-256
keys beside ed25519, `kit keys new`, and `kit verify --model-signature`'s refusals. The standard tools' own
verdicts on the same files are tests/evidence/test_standard_verifiers.py's."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import run_kit, run_manifest, seal_test_run
from kit.evidence import bundle as E
from kit.evidence.attestation import (ATTESTATION, MODEL_SIGNATURE, PREDICATE_TYPE, STATEMENT_SCHEMA,
                                      run_attestation_problems, sign_envelope)
from kit.evidence.audit import verify_run_dir, write_in_toto
from kit.evidence.model_signature import BUNDLE_SCHEMA, bundle_digests, model_statement, sign_digests
from kit.evidence.signing import load_private_key, load_public_key, write_key_pair
from kit.model.documents import schema_problems
from kit.model.errors import BadInput


def keys(tmp_path: Path, name: str, kind: str = "ecdsa-p256") -> tuple[Path, Path]:
    private, public, _ = write_key_pair(tmp_path / "keys" / name, kind)
    return private, public


def make_run(tmp_path: Path, run_id: str, sign_key: Path | None) -> Path:
    run_dir = E.create_run_dir(tmp_path / "ws", run_id)
    E.write_document(run_dir, "manifest.json", run_manifest("smoke", run_id))
    E.write_new_text(run_dir, "run.log", "# header\nstep 0: {'a': 1}\n")
    E.write_new_text(run_dir, "readbacks/vllm-rollout-1.json", "{}\n")
    seal_test_run(run_dir, run_id, sign_key=sign_key)
    return run_dir


def verify(*args: str) -> tuple[int, dict | str]:
    proc = run_kit("verify", "--json", *args)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr


def test_a_p256_signed_run_seals_its_attestation_and_model_signature(tmp_path):
    private, public = keys(tmp_path, "lab")
    run_dir = make_run(tmp_path, "r1", private)
    seal = json.loads((run_dir / E.SEAL).read_text())
    assert seal["schema"] == "rlk-kit/seal/v4" and seal["signature"]["algorithm"] == "ecdsa-p256-sha256"
    listed = {a["path"]: a for a in seal["artifacts"]}
    assert {ATTESTATION, MODEL_SIGNATURE} <= set(listed) and listed[ATTESTATION]["mode"] == "0444"
    envelope = json.loads((run_dir / ATTESTATION).read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and statement["predicateType"] == PREDICATE_TYPE
    assert {s["name"] for s in statement["subject"]} == set(listed) - {ATTESTATION, MODEL_SIGNATURE}
    assert statement["predicate"]["run_id"] == "r1" and statement["predicate"]["validation_passed"] is True
    bundle = json.loads((run_dir / MODEL_SIGNATURE).read_text())
    assert not schema_problems(bundle, as_schema=BUNDLE_SCHEMA) and not schema_problems(statement, as_schema=STATEMENT_SCHEMA)
    signed, ignored, found = bundle_digests(bundle, load_public_key(public))
    assert not found and sorted(ignored) == ["model.sig", "seal.json"] and ATTESTATION in signed
    rc, doc = verify("--key", str(public), str(run_dir))
    assert rc == 0 and doc["results"][0]["trust"] == "trusted", doc
    assert any(n.startswith("in-toto attestation") for n in doc["results"][0]["notes"]), doc
    assert any(n.startswith("model signature") for n in doc["results"][0]["notes"]), doc


def test_an_ed25519_signed_run_has_the_attestation_only_and_keeps_seal_v3(tmp_path):
    private, public = keys(tmp_path, "ed", "ed25519")
    run_dir = make_run(tmp_path, "r1", private)
    seal = json.loads((run_dir / E.SEAL).read_text())
    assert seal["schema"] == "rlk-kit/seal/v3" and (run_dir / ATTESTATION).is_file()
    assert not (run_dir / MODEL_SIGNATURE).exists()
    rc, doc = verify("--key", str(public), str(run_dir))
    assert rc == 0, doc
    assert not (make_run(tmp_path, "r2", None) / ATTESTATION).exists()      # unsigned: nothing to attest with


def test_an_attestation_that_disagrees_with_the_seal_is_named(tmp_path):
    """A key holder who re-signs an attestation listing other bytes (or another verdict) is caught by the
    cross-check, though every signature is good."""
    private, _ = keys(tmp_path, "lab")
    run_dir = make_run(tmp_path, "r1", private)
    seal = json.loads((run_dir / E.SEAL).read_text())
    assert verify_run_dir(run_dir).status == "ok" and run_attestation_problems(run_dir, seal)[0] == []
    statement = json.loads(base64.b64decode(json.loads((run_dir / ATTESTATION).read_text())["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "0" * 64
    statement["predicate"]["validation_passed"] = False
    forged = tmp_path / "forged"
    forged.mkdir()
    statement["predicate"]["gates"] = [{"id": "job-succeeded", "status": "failed", "problems": []}]
    for rel in (ATTESTATION, "manifest.json", "validation.json"):
        (forged / rel).write_text((run_dir / rel).read_text())
    (forged / ATTESTATION).write_text(json.dumps(sign_envelope(statement, load_private_key(private))))
    problems, _ = run_attestation_problems(forged, seal)
    pointers = [p for p, _ in problems]
    assert "/attestation.dsse.json/payload/subject" in pointers, problems
    assert "/attestation.dsse.json/payload/predicate/validation_passed" in pointers, problems
    assert "/attestation.dsse.json/payload/predicate/gates" in pointers, problems
    other, _ = keys(tmp_path, "other")
    (forged / ATTESTATION).write_text(json.dumps(sign_envelope(statement, load_private_key(other))))
    problems, _ = run_attestation_problems(forged, seal)
    assert problems and "no signature by key" in problems[0][1], problems


def test_model_signature_bundles_refuse_edits_and_other_keys(tmp_path):
    private, public = keys(tmp_path, "lab")
    _, other = keys(tmp_path, "other")
    bundle = sign_digests("d", {"a": "11" * 32, "b/c": "22" * 32}, ["model.sig"], load_private_key(private))
    assert bundle_digests(bundle, load_public_key(public))[0] == {"a": "11" * 32, "b/c": "22" * 32}
    assert "not by the --key" in bundle_digests(bundle, load_public_key(other))[2][0]
    edited = json.loads(json.dumps(bundle))
    statement = model_statement("d", {"a": "33" * 32, "b/c": "22" * 32}, ["model.sig"])
    edited["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    assert "does not match its payload" in bundle_digests(edited, load_public_key(public))[2][0]
    keyless = json.loads(json.dumps(bundle))
    keyless["verificationMaterial"] = {"certificate": {"rawBytes": "MII="}, "tlogEntries": []}
    assert "model_signing verify sigstore" in bundle_digests(keyless, load_public_key(public))[2][0]
    ed_private, _ = keys(tmp_path, "ed", "ed25519")
    with pytest.raises(BadInput, match="ECDSA P-256"):
        sign_digests("d", {}, [], load_private_key(ed_private))


def test_verify_model_signature_refuses_bad_input_in_one_line(tmp_path):
    _, public = keys(tmp_path, "lab")
    _, ed_public = keys(tmp_path, "ed", "ed25519")
    (tmp_path / "d").mkdir()
    (tmp_path / "junk.sig").write_text("not json")
    (tmp_path / "other.sig").write_text('{"mediaType": "x"}')
    cases = [(["--model-signature", "junk.sig", str(tmp_path / "d")], "--key PUB"),
             (["--model-signature", "junk.sig", "--key", str(ed_public), str(tmp_path / "d")], "ECDSA P-256"),
             (["--model-signature", "junk.sig", "--key", str(public), str(tmp_path / "d"), str(tmp_path)], "exactly one"),
             (["--model-signature", str(tmp_path / "junk.sig"), "--key", str(public), str(tmp_path / "d")], "junk.sig"),
             (["--model-signature", str(tmp_path / "other.sig"), "--key", str(public), str(tmp_path / "d")],
              "not a model-signing signature")]
    for args, words in cases:
        proc = run_kit("verify", *args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_keys_new_writes_a_private_key_only_its_owner_reads_and_never_replaces_one(tmp_path):
    proc = run_kit("keys", "new", "--json", "k/lab", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "rlk-kit/key-pair/v1" and doc["type"] == "ecdsa-p256" and len(doc["keyid"]) == 64
    private = tmp_path / "k" / "lab.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and b"PRIVATE KEY" not in proc.stdout.encode()
    before = private.read_bytes()
    proc = run_kit("keys", "new", "k/lab", cwd=tmp_path)
    assert proc.returncode == 2 and "exists" in proc.stderr and private.read_bytes() == before, proc.stderr
    assert run_kit("keys", "new", "--force", "k/lab", cwd=tmp_path).returncode == 0 and private.read_bytes() != before
    assert load_private_key(private) and load_public_key(tmp_path / "k" / "lab.pub")
    for bad in ("", ".", ".."):
        proc = run_kit("keys", "new", bad, cwd=tmp_path)
        assert proc.returncode == 2 and "NAME" in proc.stderr and "Traceback" not in proc.stderr, (bad, proc.stderr)
    if os.geteuid() != 0:      # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        proc = run_kit("keys", "new", "ro/x", cwd=tmp_path)
        assert proc.returncode == 2 and "cannot write" in proc.stderr, proc.stderr


def test_an_unsupported_key_type_is_refused_naming_what_is_accepted(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path = tmp_path / "p384.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    with pytest.raises(BadInput, match="expected an ed25519 or ECDSA P-256 key"):
        load_private_key(path)


def test_a_build_provenance_signed_with_p256_verifies_and_another_key_fails(tmp_path):
    from test_provenance_signature import STATEMENT

    from kit.evidence.provenance_signature import sign_provenance
    from kit.model.documents import dumps_pretty

    private, public = keys(tmp_path, "build")
    _, other = keys(tmp_path, "other")
    path = tmp_path / "builds" / "rlk-kit_smoke_cpu-0123456789ab.provenance.json"
    path.parent.mkdir()
    path.write_text(dumps_pretty(STATEMENT))
    envelope = sign_provenance(path, load_private_key(private))
    assert len(base64.b64decode(json.loads(envelope.read_text())["signatures"][0]["public_key"])) == 91   # DER P-256
    rc, doc = verify("--key", str(public), str(path))
    assert rc == 0 and any("ECDSA P-256" in n for n in doc["results"][0]["notes"]), doc
    rc, doc = verify("--key", str(other), str(path))
    assert rc == 1, doc


def test_in_toto_export_of_a_seal_v4_run_is_its_signed_attestation(tmp_path):
    private, _ = keys(tmp_path, "lab")
    run_dir = make_run(tmp_path, "r1", private)
    out = tmp_path / "statement.json"
    proc = run_kit("verify", "--in-toto", str(out), str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    statement = json.loads(out.read_text())
    envelope = json.loads((run_dir / ATTESTATION).read_text())
    assert statement == json.loads(base64.b64decode(envelope["payload"])) and statement["predicateType"] == PREDICATE_TYPE


def test_write_in_toto_writes_what_kit_verify_in_toto_writes_for_every_seal(tmp_path):
    """The library path (audit.write_in_toto, verify_run_dir(in_toto_out=…)) and `kit verify --in-toto` export
    the same statement: for a seal v4 the run's sealed, signed attestation, for v3 the seal's statement."""
    for name, kind, schema in (("lab", "ecdsa-p256", "rlk-kit/seal/v4"), ("ed", "ed25519", "rlk-kit/seal/v3"),
                               (None, None, "rlk-kit/seal/v3")):
        root = tmp_path / (name or "unsigned")
        run_dir = make_run(root, "r1", keys(root, name, kind)[0] if name else None)
        seal = json.loads((run_dir / E.SEAL).read_text())
        assert seal["schema"] == schema
        proc = run_kit("verify", "--in-toto", str(root / "cli.json"), str(run_dir))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        cli = json.loads((root / "cli.json").read_text())
        write_in_toto(seal, root / "direct.json", run_dir)
        assert json.loads((root / "direct.json").read_text()) == cli, schema
        assert verify_run_dir(run_dir, in_toto_out=root / "verified.json").status == "ok"
        assert json.loads((root / "verified.json").read_text()) == cli, schema
        if schema == "rlk-kit/seal/v4":
            assert cli["predicateType"] == PREDICATE_TYPE
            with pytest.raises(BadInput, match="seal/v4.*run dir"):       # the statement lies in the run dir
                write_in_toto(seal, root / "no-dir.json")
            assert not (root / "no-dir.json").exists()


def test_write_in_toto_refuses_a_seal_v4_whose_attestation_does_not_hold_to_it(tmp_path):
    private, _ = keys(tmp_path, "lab")
    run_dir = make_run(tmp_path, "r1", private)
    seal = json.loads((run_dir / E.SEAL).read_text())
    other = make_run(tmp_path, "r2", private)                 # another run's attestation, same key
    with pytest.raises(BadInput, match="attestation"):
        write_in_toto(seal, tmp_path / "out.json", other)
    assert not (tmp_path / "out.json").exists()


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=12))
_json = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=12)
_FUZZ_KEY = {}


def _fuzz_key():
    if not _FUZZ_KEY:
        from cryptography.hazmat.primitives.asymmetric import ec
        _FUZZ_KEY["key"] = ec.generate_private_key(ec.SECP256R1())
    return _FUZZ_KEY["key"]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(where=st.sampled_from([(), ("dsseEnvelope",), ("verificationMaterial",), ("verificationMaterial", "publicKey"),
                              ("dsseEnvelope", "signatures"), ("dsseEnvelope", "payload"), ("dsseEnvelope", "payloadType")]),
       value=_json, statement=st.one_of(st.none(), _json, st.sampled_from(["subject", "predicate", "serialization",
                                                                            "resources", "predicateType"])))
def test_any_bundle_shape_is_a_verdict_never_an_exception(where, value, statement):
    """A bundle edited anywhere, or a validly signed statement of any shape: bundle_digests names a problem
    (or returns string digests), and never raises."""
    key = _fuzz_key()
    doc = model_statement("d", {"a": "11" * 32}, ["model.sig"])
    if statement in ("subject", "predicateType"):
        doc[statement] = value
    elif statement in ("predicate",):
        doc["predicate"] = value
    elif statement in ("serialization", "resources"):
        doc["predicate"][statement] = value
    elif statement is not None:
        doc = statement
    payload = json.dumps(doc).encode()
    from kit.evidence.signing import pae, sign_bytes
    bundle = sign_digests("d", {"a": "11" * 32}, ["model.sig"], key)
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(
        sign_bytes(key, pae("application/vnd.in-toto+json", payload))).decode()
    if where:
        target = bundle
        for part in where[:-1]:
            target = target[part]
        target[where[-1]] = value
    digests, ignored, problems = bundle_digests(bundle, key.public_key())
    assert problems or (all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items())
                        and all(isinstance(p, str) for p in ignored))


def test_a_fifo_or_device_given_as_a_key_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    for args in (["verify", "--key", str(fifo), str(tmp_path)], ["verify", "--key", "/dev/zero", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr
    with pytest.raises(BadInput, match="not a regular file"):
        load_private_key(fifo)


def test_a_signature_file_given_alone_points_to_its_directory(tmp_path):
    private, _ = keys(tmp_path, "lab")
    run_dir = make_run(tmp_path, "r1", private)
    for name, words in ((ATTESTATION, "give the run dir"), (MODEL_SIGNATURE, "--model-signature")):
        rc, doc = verify(str(run_dir / name))
        assert rc == 2 and words in doc["results"][0]["problems"][0]["message"], doc
