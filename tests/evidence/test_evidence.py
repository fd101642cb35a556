"""Run dirs, the seal, verification (missing/changed/extra files, signatures, in-toto), run comparison, redaction."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kit.evidence import bundle as E
from kit.model.catalog import Catalog
from kit.evidence.compare import compare_run_manifests
from kit.model.documents import require_valid_as, schema_problems
from kit.model.errors import BadInput, CheckFailed
from kit.evidence.redact import REDACTED, Redactor, redact_env

from conftest import run_manifest, seal_test_run
from kit.evidence.audit import IN_TOTO_SCHEMAS, verify_run_dir, write_in_toto


def minimal_manifest(run_id: str) -> dict:
    return run_manifest("smoke", run_id)


def make_run(workspace: Path, run_id: str = "r1", *, sign_key: Path | None = None) -> Path:
    run_dir = E.create_run_dir(workspace, run_id)
    E.write_document(run_dir, "manifest.json", minimal_manifest(run_id))
    E.write_new_text(run_dir, "run.log", "# header\nstep 0: {'a': 1}\n")
    E.write_new_text(run_dir, "metrics.jsonl", '{"kind": "step"}\n')
    E.write_new_text(run_dir, "readbacks/vllm-rollout-1.json", "{}\n")
    seal_test_run(run_dir, run_id, sign_key=sign_key)
    return run_dir


def problems(run_dir, **kw):
    verdict = verify_run_dir(run_dir, **kw)
    return verdict.status, [p for p, _ in verdict.problems], verdict


def test_seal_lists_every_artifact_and_verifies(tmp_path):
    run_dir = make_run(tmp_path)
    seal = json.loads((run_dir / "seal.json").read_text())
    assert schema_problems(seal, "seal") == []
    assert [a["path"] for a in seal["artifacts"]] == ["manifest.json", "metrics.jsonl", "readbacks/vllm-rollout-1.json",
                                                     "run.log", "status.json", "validation.json"]
    assert seal["manifest_sha256"] == seal["artifacts"][0]["sha256"]
    # the root hash is the sha256 of sha256sum-style lines
    import hashlib
    lines = "".join(f"{a['sha256']}  {a['path']}\n" for a in seal["artifacts"])
    assert seal["root_sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    status, found, _ = problems(run_dir)
    assert (status, found) == ("ok", [])


def test_sealed_dir_is_never_written_again(tmp_path):
    run_dir = make_run(tmp_path)
    with pytest.raises(CheckFailed, match="sealed"):
        E.write_new_text(run_dir, "late.txt", "x")
    with pytest.raises(CheckFailed, match="sealed"):
        E.seal_run_dir(run_dir, run_id="r1", validation_passed=True, gate_set_version="g/1")
    assert not os.access(run_dir / "run.log", os.W_OK) or os.geteuid() == 0
    assert (run_dir / "run.log").stat().st_mode & 0o222 == 0


def test_flipped_byte_missing_and_extra_files_are_named(tmp_path):
    run_dir = make_run(tmp_path)
    log = run_dir / "run.log"
    log.chmod(0o644)
    data = bytearray(log.read_bytes())
    data[3] ^= 0x01
    log.write_bytes(bytes(data))
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "readbacks" / "added.json").write_text("{}")
    status, found, verdict = problems(run_dir)
    assert status == "fail"
    assert found == ["/metrics.jsonl", "/run.log", "/readbacks/added.json"]
    messages = dict(verdict.problems)
    assert messages["/metrics.jsonl"].startswith("missing")
    assert messages["/run.log"].startswith("changed")
    assert messages["/readbacks/added.json"].startswith("extra")


def test_edited_seal_is_caught(tmp_path):
    run_dir = make_run(tmp_path)
    seal_path = run_dir / "seal.json"
    seal = json.loads(seal_path.read_text())
    seal["artifacts"][0]["sha256"] = "0" * 64
    seal_path.chmod(0o644)
    seal_path.write_text(json.dumps(seal))
    status, found, _ = problems(run_dir)
    assert status == "fail" and "/seal.json/root_sha256" in found


def test_unsealed_dir_fails_with_its_status(tmp_path):
    run_dir = E.create_run_dir(tmp_path, "r2")
    status, found, verdict = problems(run_dir)
    assert status == "fail" and found == ["/seal.json"]


def _keypair(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def test_signed_seal_verifies_with_its_key_only(tmp_path):
    priv, pub = _keypair(tmp_path / "a" if (tmp_path / "a").mkdir() is None else None)
    other_priv, other_pub = _keypair(tmp_path / "b" if (tmp_path / "b").mkdir() is None else None)
    run_dir = make_run(tmp_path / "ws", sign_key=priv)
    assert problems(run_dir, public_key=pub)[:2] == ("ok", [])
    status, found, _ = problems(run_dir, public_key=other_pub)
    assert status == "fail" and found == ["/seal.json/signature"]
    unsigned = make_run(tmp_path / "ws", "r9")
    status, found, _ = problems(unsigned, public_key=pub)
    assert status == "fail" and found == ["/seal.json/signature"]


def test_bad_key_file_is_bad_input(tmp_path):
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key")
    run_dir = make_run(tmp_path / "ws")
    with pytest.raises(BadInput, match="--key"):
        verify_run_dir(run_dir, public_key=bad)


def test_in_toto_statement(tmp_path):
    run_dir = make_run(tmp_path)
    out = tmp_path / "statement.json"
    assert problems(run_dir, in_toto_out=out)[0] == "ok"
    st_doc = json.loads(out.read_text())
    assert st_doc["_type"] == "https://in-toto.io/Statement/v1"
    assert st_doc["predicateType"].startswith("https://rlk-kit.dev/")
    seal = json.loads((run_dir / "seal.json").read_text())
    assert st_doc["subject"] == [{"name": a["path"], "digest": {"sha256": a["sha256"]}} for a in seal["artifacts"]]
    assert st_doc["predicate"]["root_sha256"] == seal["root_sha256"]
    # The statement validates against its shipped schema, which refuses a subject without a digest.
    assert require_valid_as(st_doc, str(out), IN_TOTO_SCHEMAS[seal['schema']]) == st_doc
    st_doc["subject"][0]["digest"] = {"sha256": "not-hex"}
    with pytest.raises(BadInput, match="/subject/0/digest/sha256"):
        require_valid_as(st_doc, str(out), IN_TOTO_SCHEMAS[seal['schema']])
    # An existing statement is never replaced.
    with pytest.raises(BadInput, match="--in-toto"):
        write_in_toto(seal, out)


def test_run_ids_are_never_reused_anywhere_in_the_workspace(tmp_path):
    E.create_run_dir(tmp_path, "once")
    with pytest.raises(BadInput, match="already used"):
        E.create_run_dir(tmp_path, "once")
    # a deleted run dir still holds its id through the registry
    (tmp_path / "runs" / "once").rmdir()
    with pytest.raises(BadInput, match="already used"):
        E.create_run_dir(tmp_path, "once")
    # an id used by a suite's run dir is taken too
    (tmp_path / "suites" / "s1" / "runs" / "in-suite").mkdir(parents=True)
    with pytest.raises(BadInput, match="already used"):
        E.create_run_dir(tmp_path, "in-suite")


# --- comparison of runs -----------------------------------------------------------------------------------

def _manifest(arm_name: str, run_id: str, **observed) -> dict:
    catalog = Catalog.default()
    arm = catalog.arm(arm_name)
    identity = {"python": {"version": "3.11.2"}, "packages": {"torch": "2.13.0+cpu"}, "hostname": f"host-{run_id}",
                "observed_at": run_id} | observed
    return {"run_id": run_id, "arm": copy.deepcopy(arm.document),
            "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256, "document": arm.stack.document},
            "image": {"ref": "x", "id": "sha256:aaa"}, "observed_identity": identity}


def test_compare_runs_volatile_fields_ignored_software_differences_uncontrolled():
    a, b = _manifest("smoke", "r1"), _manifest("smoke", "r2")
    assert compare_run_manifests(a, b).controlled
    c = _manifest("smoke", "r3", packages={"torch": "2.13.1+cpu"})
    result = compare_run_manifests(a, c)
    assert not result.controlled
    assert [d.path for d in result.uncontrolled] == ["observed.packages.torch"]
    d = _manifest("smoke", "r4")
    d["image"]["id"] = "sha256:bbb"
    assert [x.path for x in compare_run_manifests(a, d).uncontrolled] == ["image.id"]


def test_compare_runs_declared_operators_factor():
    result = compare_run_manifests(_manifest("native", "r1"), _manifest("consistency", "r2"))
    assert result.controlled, [d.path for d in result.uncontrolled]
    assert {d.path.split(".")[0] for d in result.differences} == {"operators"}


# --- redaction ---------------------------------------------------------------------------------------------

def test_redaction_by_name_and_value():
    env = {"HF_TOKEN": "hf_secret_value_1", "MY_API_KEY": "k-123456", "AWS_SECRET_ACCESS_KEY": "abcdefgh",
           "DB_PASSWD": "pw-999999", "GIT_CREDENTIALS": "user:pass99", "AUTH_HEADER": "Bearer xyzxyz", "PATH": "/bin",
           "SHORT_TOKEN": "1"}
    red = redact_env(env)
    assert red["PATH"] == "/bin"
    assert all(red[k] == REDACTED for k in env if k != "PATH")
    r = Redactor.from_env(env)
    text = r.text("echo hf_secret_value_1 and k-123456 and 1")
    assert "hf_secret_value_1" not in text and "k-123456" not in text and text.endswith(" 1")
    assert r.document({"x": ["Bearer xyzxyz"]}) == {"x": ["<redacted:AUTH_HEADER>"]}


def test_a_password_inside_a_url_is_redacted_whatever_the_variable_is_called():
    env = {"HTTPS_PROXY": "http://u:zzsecret666@proxy:1", "PIP_INDEX_URL": "https://pypi.org/simple",
           "MIRRORS": "https://a:pw-one-1@m1/x https://b:pw-two-2@m2/y"}
    red = redact_env(env)
    assert red["HTTPS_PROXY"] == "http://u:<redacted>@proxy:1" and red["PIP_INDEX_URL"] == "https://pypi.org/simple"
    assert "pw-one-1" not in red["MIRRORS"] and "pw-two-2" not in red["MIRRORS"]
    text = Redactor.from_env(env).text("connecting via http://u:zzsecret666@proxy:1, then pw-two-2")
    assert "zzsecret666" not in text and "pw-two-2" not in text and "<redacted:HTTPS_PROXY>" in text


@settings(max_examples=50, deadline=None)
@given(secret=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=6, max_size=40),
       noise=st.text(max_size=40))
def test_redactor_never_leaks_a_secret(secret, noise):
    r = Redactor.from_env({"SERVICE_TOKEN": secret})
    assert secret not in r.text(noise + secret + noise + secret)


def test_file_system_errors_reach_the_user_as_one_line_naming_the_path(tmp_path):
    """An OSError escaping a command is one line naming the path, exit 2 for an unusable path; an
    unwritable --workspace is named as the flag."""
    from click.testing import CliRunner

    from kit.cli import cli

    run_dir = make_run(tmp_path / "ws")
    out = tmp_path / "a-file"
    out.write_text("not a directory\n")
    result = CliRunner().invoke(cli, ["verify", str(run_dir), "--in-toto", str(out / "statement.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"kit: {out}: ") and result.stderr.count("\n") == 1, result.stderr
    with pytest.raises(BadInput, match=f"--workspace {out}: cannot create {out}/runs"):
        E.create_run_dir(out, "r2")


def test_a_directory_that_is_no_run_dir_is_unusable_input_not_a_failed_seal(tmp_path):
    from click.testing import CliRunner

    from kit.cli import cli

    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "stack.json").write_text("{}\n")
    verdict = verify_run_dir(tmp_path / "locks")
    assert verdict.status == "unreadable" and "not a run directory" in verdict.problems[0][1]
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "locks")])
    assert result.exit_code == 2 and "locks/*.json" in result.output, result.output
    # a run dir whose run never sealed is still a failed check
    run_dir = E.create_run_dir(tmp_path / "ws", "r9")
    E.write_document(run_dir, "manifest.json", minimal_manifest("r9"))
    assert verify_run_dir(run_dir).status == "fail"
