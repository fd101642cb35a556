"""Kit-written evidence checked by the standard tools alone, in a virtualenv without the kit.

A smoke run signed with an ECDSA P-256 key made by `kit keys new` is verified by `model_signing
verify key` (OpenSSF model signing) and by securesystemslib's DSSE verifier with the in-toto
attestation model (scripts/verify-in-toto.py); three tampered copies (a changed byte, a removed file,
a changed byte re-sealed and re-signed with another key) are refused by both and by `kit verify --key`.
`kit verify` accepts what `model_signing sign key` produced, and an ed25519-signed run's attestation
verifies with the same DSSE tool. The build provenance case needs a built image (marked docker).
"""

from __future__ import annotations

import base64
import json
import shutil
import stat
from pathlib import Path

import pytest


from sealed_run import kit, sealed_smoke  # noqa: F401  (a session fixture)
from standard_tools import standard_tools  # noqa: F401  (a session fixture)
from kit.evidence import bundle as E
from kit.evidence.attestation import ATTESTATION, MODEL_SIGNATURE
from kit.evidence.signing import load_private_key

pytestmark = pytest.mark.slow
RUN_ID = "std-p256"


def _writable(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        path.chmod(stat.S_IMODE(path.lstat().st_mode) | stat.S_IWUSR)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def signed_run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("standard")
    keys = {}
    for name in ("lab", "other"):
        proc = kit("keys", "new", "--json", str(root / "keys" / name))
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["type"] == "ecdsa-p256" and "model_signing verify key" in doc["verified_by"], doc
        keys[name] = (Path(doc["private_key"]), Path(doc["public_key"]))
    proc = kit("run", "--arm", "smoke", "--rollouts", "1", "--run-id", RUN_ID, "--allow-dirty",
               "--sign-key", str(keys["lab"][0]), env={"KIT_WORKSPACE": str(root / "ws")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = root / "ws" / "runs" / RUN_ID
    assert (run_dir / ATTESTATION).is_file() and (run_dir / MODEL_SIGNATURE).is_file()
    return {"root": root, "run": run_dir, "keys": keys}


def _tampered(signed_run: dict, case: str) -> Path:
    """A copy of the signed run (same name, so only the tampering differs) with one tampering."""
    copy = signed_run["root"] / f"tamper-{case}" / RUN_ID
    if copy.exists():
        return copy
    shutil.copytree(signed_run["run"], copy)
    _writable(copy)
    if case == "changed-byte":
        _flip_byte(copy / "run.log")
    elif case == "removed-file":
        (copy / "metrics.jsonl").unlink()
    elif case == "resigned-other-key":
        _flip_byte(copy / "run.log")
        seal = json.loads((copy / E.SEAL).read_text())
        (copy / E.SEAL).unlink()
        E.seal_run_dir(copy, run_id=RUN_ID, validation_passed=seal["validation_passed"],
                       gate_set_version=seal["gate_set_version"],
                       private_key=load_private_key(signed_run["keys"]["other"][0]))
    return copy


def test_a_signed_run_verifies_with_model_signing_and_a_dsse_in_toto_verifier(standard_tools, signed_run, tmp_path):
    run_dir, pub = signed_run["run"], signed_run["keys"]["lab"][1]
    ms = standard_tools.model_signing_verify(run_dir, run_dir / MODEL_SIGNATURE, pub, cwd=tmp_path)
    assert ms.returncode == 0 and "Verification succeeded" in ms.stdout, ms.stdout + ms.stderr
    dsse = standard_tools.verify_in_toto(run_dir / ATTESTATION, pub, tmp_path, "--dir", str(run_dir))
    assert dsse.returncode == 0 and dsse.stdout.startswith("VERIFIED"), dsse.stdout + dsse.stderr
    # every file but the seal and the signature files is a subject, each with its sealed sha256
    statement = json.loads(base64.b64decode(json.loads((run_dir / ATTESTATION).read_text())["payload"]))
    sealed = {a["path"]: a["sha256"] for a in json.loads((run_dir / E.SEAL).read_text())["artifacts"]}
    assert {s["name"]: s["digest"]["sha256"] for s in statement["subject"]} == \
        {p: d for p, d in sealed.items() if p not in (ATTESTATION, MODEL_SIGNATURE)}
    assert statement["predicateType"] == "https://rlk-kit.dev/attestation/run/v2"
    assert statement["predicate"]["validation_passed"] is True
    gates = json.loads((run_dir / "validation.json").read_text())["gates"]
    assert [g["id"] for g in statement["predicate"]["gates"]] == [g["id"] for g in gates] and gates
    proc = kit("verify", "--key", str(pub), str(run_dir))
    assert proc.returncode == 0 and "in-toto attestation" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", ["changed-byte", "removed-file", "resigned-other-key"])
def test_each_tampered_copy_is_refused_by_every_verifier(standard_tools, signed_run, tmp_path, case):
    copy, pub = _tampered(signed_run, case), signed_run["keys"]["lab"][1]
    ms = standard_tools.model_signing_verify(copy, copy / MODEL_SIGNATURE, pub, cwd=tmp_path)
    assert ms.returncode != 0 and "Verification failed" in ms.stderr, ms.stdout + ms.stderr
    dsse = standard_tools.verify_in_toto(copy / ATTESTATION, pub, tmp_path, "--dir", str(copy))
    assert dsse.returncode == 1 and dsse.stdout.startswith("REFUSED"), dsse.stdout + dsse.stderr
    proc = kit("verify", "--key", str(pub), str(copy))
    assert proc.returncode == 1 and "FAIL" in proc.stdout, proc.stdout + proc.stderr
    if case == "resigned-other-key":
        # the forger's own key accepts the forgery: only the key the reader holds tells them apart
        other = signed_run["keys"]["other"][1]
        assert standard_tools.model_signing_verify(copy, copy / MODEL_SIGNATURE, other, cwd=tmp_path).returncode == 0
        assert standard_tools.verify_in_toto(copy / ATTESTATION, other, tmp_path, "--dir", str(copy)).returncode == 0


def test_kit_verify_accepts_what_model_signing_signed_and_refuses_an_edit(standard_tools, signed_run, tmp_path):
    private, public = signed_run["keys"]["other"]
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "shards").mkdir(parents=True)
    (checkpoint / "config.json").write_text('{"hidden_size": 8}\n')
    (checkpoint / "shards" / "model-00001.safetensors").write_bytes(bytes(range(256)) * 64)
    signature = tmp_path / "checkpoint.sig"
    signed = standard_tools.model_signing_sign(checkpoint, signature, private, cwd=tmp_path)
    assert signed.returncode == 0, signed.stdout + signed.stderr
    proc = kit("verify", "--model-signature", str(signature), "--key", str(public), str(checkpoint))
    assert proc.returncode == 0 and "2 files" in proc.stdout, proc.stdout + proc.stderr
    # a sealed run co-signed by a second party with model_signing: the seal and the model signature both hold
    copy = tmp_path / "cosigned" / RUN_ID
    shutil.copytree(signed_run["run"], copy)
    cosig = tmp_path / "cosigned.sig"
    assert standard_tools.model_signing_sign(copy, cosig, private, cwd=tmp_path).returncode == 0
    proc = kit("verify", "--json", "--model-signature", str(cosig), "--key", str(public), str(copy))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["kind"] for r in json.loads(proc.stdout)["results"]] == ["run", "model-signed dir"]
    _flip_byte(checkpoint / "shards" / "model-00001.safetensors")
    proc = kit("verify", "--model-signature", str(signature), "--key", str(public), str(checkpoint))
    assert proc.returncode == 1 and "shards/model-00001.safetensors: changed" in proc.stdout, proc.stdout
    proc = kit("verify", "--model-signature", str(signature), "--key", str(signed_run["keys"]["lab"][1]), str(checkpoint))
    assert proc.returncode == 1 and "not by the --key" in proc.stdout, proc.stdout


def test_an_ed25519_signed_run_attestation_verifies_with_the_dsse_tool(standard_tools, sealed_smoke, tmp_path):
    run_dir, pub = sealed_smoke["signed"], sealed_smoke["pub"]
    assert not (run_dir / MODEL_SIGNATURE).exists()       # model signing takes no ed25519 key
    dsse = standard_tools.verify_in_toto(run_dir / ATTESTATION, pub, tmp_path, "--dir", str(run_dir))
    assert dsse.returncode == 0, dsse.stdout + dsse.stderr
    other = tmp_path / "other"
    assert kit("keys", "new", "--type", "ed25519", str(other)).returncode == 0
    dsse = standard_tools.verify_in_toto(run_dir / ATTESTATION, other.with_suffix(".pub"), tmp_path, "--dir", str(run_dir))
    assert dsse.returncode == 1, dsse.stdout + dsse.stderr


@pytest.mark.docker
def test_signed_image_provenance_verifies_with_the_dsse_tool(standard_tools, cpu_image, kit_workspace, tmp_path):
    from kit.evidence.provenance_signature import sign_provenance

    found = sorted(Path(kit_workspace, "builds").glob(f"{cpu_image.tag.replace('/', '_').replace(':', '_')}*.provenance.json"))
    assert found, f"no provenance of {cpu_image.tag} in {kit_workspace}/builds"
    statement = tmp_path / found[0].name
    shutil.copyfile(found[0], statement)
    keys = {}
    for name in ("build", "other"):
        assert kit("keys", "new", str(tmp_path / name)).returncode == 0
        keys[name] = (tmp_path / f"{name}.pem", tmp_path / f"{name}.pub")
    envelope = sign_provenance(statement, load_private_key(keys["build"][0]))
    slsa = ("--predicate-type", "https://slsa.dev/provenance/v1")
    ok = standard_tools.verify_in_toto(envelope, keys["build"][1], tmp_path, *slsa)
    assert ok.returncode == 0 and "VERIFIED" in ok.stdout, ok.stdout + ok.stderr
    assert standard_tools.verify_in_toto(envelope, keys["other"][1], tmp_path, *slsa).returncode == 1
    doc = json.loads(envelope.read_text())
    payload = json.loads(base64.b64decode(doc["payload"]))
    payload["subject"][0]["digest"]["sha256"] = "0" * 64
    doc["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    forged = tmp_path / "forged.dsse.json"
    forged.write_text(json.dumps(doc))
    assert standard_tools.verify_in_toto(forged, keys["build"][1], tmp_path, *slsa).returncode == 1
