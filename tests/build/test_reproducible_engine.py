"""Reproducible CPU smoke images on the real engine: a rebuild elsewhere gives the same id, a
non-determinism is named, the provenance holds every input and a changed field fails verification."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path


from conftest import REPO, run_kit
from kit.build.images import build_image, plan_build
from kit.build.plan import ContextEntry
from kit.build.provenance import LABEL, subject_layers
from kit.build.recheck import check_reproducible
from kit.cli.build import _difference_text
from kit.evidence.provenance_signature import envelope_path
from kit.model.catalog import Catalog
from kit.model.documents import read_json_file, schema_problems, sha256_of_document


def smoke_args(cpu_image, workspace):
    args = ["build", "cpu", "--arm", "smoke", "--json", "--workspace", str(workspace)]
    for name, path in sorted(cpu_image.sources.items()):
        args += ["--source", f"{name}={path}"]
    return args


def test_image_is_written_by_the_kit_with_its_provenance_label(cpu_image, docker_engine):
    record = cpu_image.record
    assert record["schema"] == "rlk-kit/build-record/v4"
    image = docker_engine.images.get(cpu_image.tag)
    assert image.id == cpu_image.image_id
    assert image.labels[LABEL] == record["provenance"]["sha256"]
    assert image.attrs["Created"].startswith(record["labels"]["org.opencontainers.image.created"][:19])
    # the provenance names the image's layers; a record of this build (not a reuse) says the same
    statement = read_json_file(Path(record["provenance"]["path"]))
    assert subject_layers(statement) == image.attrs["RootFS"]["Layers"]
    if record["steps"]:   # 0: the tag already held the image, this record is of a reuse
        assert [layer["diff_id"] for layer in record["reproducible"]["layers"]] == image.attrs["RootFS"]["Layers"]


def test_a_workspace_that_reuses_the_image_gets_its_provenance_back(cpu_image, kit_workspace, tmp_path):
    """The tag already holds the image (built in another workspace): nothing is built, and the
    provenance is made again from the plan and the image, equal to the label byte for byte."""
    other = tmp_path / "other-workspace"
    other.mkdir()
    shutil.copytree(kit_workspace / "wheelhouse", other / "wheelhouse", copy_function=os.link)   # no download
    proc = run_kit(*smoke_args(cpu_image, other))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    assert record["image_id"] == cpu_image.image_id and record["steps"] == 0, record
    path = Path(record["provenance"]["path"])
    assert path.parent == other / "builds", path
    assert sha256_of_document(read_json_file(path)) == record["provenance"]["sha256"] == cpu_image.record["provenance"]["sha256"]
    assert path.read_bytes() == Path(cpu_image.record["provenance"]["path"]).read_bytes()


def _inject_date(plan):
    """The plan with one more step that writes the build's clock into the image.

    A fresh build arg on that step keeps the engine's cache from replaying an earlier run of it
    (every step before it is still a cache hit, so the test costs one small step per build).
    """
    text = Path(REPO / plan.dockerfile).read_text().replace(
        "WORKDIR /workspace", "ARG INJECTED_STEP\nRUN date +%s%N > /opt/rlk/built-at\nWORKDIR /workspace")
    entries = tuple(ContextEntry.of_bytes(e.path, text.encode()) if e.path == plan.dockerfile else e for e in plan.context)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return dataclasses.replace(plan, context=entries, tag=f"rlk-kit/smoke:cpu-{digest[:12]}", inputs_sha256=digest,
                               build_args={**plan.build_args, "INJECTED_STEP": uuid.uuid4().hex})


def test_injected_non_determinism_is_named_with_its_file(cpu_image, kit_workspace, docker_engine):
    stack = Catalog.default().stack("smoke")

    def make(workspace):
        return _inject_date(plan_build(stack, "cpu", workspace=workspace, overrides=cpu_image.sources))

    first = build_image(make(kit_workspace), workspace=kit_workspace, client=docker_engine, keep_layers=True,
                        write_record=False)
    try:
        # The engine's cache serves every other step, so only the injected one differs.
        report = check_reproducible(make, first, workspace=kit_workspace, client=docker_engine, nocache=False)
        assert not report["same"]
        difference = report["difference"]
        assert [f["path"] for f in difference["files"]] == ["opt/rlk/built-at"], difference
        side = difference["files"][0]
        assert side["first"]["sha256"] != side["second"]["sha256"] and side["first"]["mtime"] == side["second"]["mtime"]
        text = _difference_text(first.tag, report)
        assert "opt/rlk/built-at" in text and f"layer {difference['layer']}" in text
    finally:
        docker_engine.images.remove(first.tag, force=True)


def test_provenance_lists_every_input_and_a_changed_field_fails_verification(cpu_image, kit_workspace, tmp_path):
    path = Path(cpu_image.record["provenance"]["path"])
    statement = read_json_file(path)
    assert schema_problems(statement, as_schema="rlk-kit/slsa-provenance/v1") == []
    assert sha256_of_document(statement) == cpu_image.record["provenance"]["sha256"]
    deps = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    stack = Catalog.default().stack("smoke")
    for src in stack.sources:
        assert deps[f"source/{src['name']}"]["digest"]["gitCommit"] == src["commit"]

    def covers(sums: Path) -> bool:   # the wheelhouse of this lock: every file named with its sha256
        rows = [line.split("  ", 1) for line in sums.read_text().splitlines()]
        return bool(rows) and all(deps.get(f"wheelhouse/{name}", {}).get("digest", {}).get("sha256") == digest
                                  for digest, name in rows)

    assert any(covers(sums) for sums in kit_workspace.glob("wheelhouse/*/SHA256SUMS"))
    assert deps["lock.json"]["digest"]["sha256"]
    assert deps["base-image"]["annotations"]["packages"]
    assert deps["rlk-kit"]["annotations"]["version"]
    ok = run_kit("verify", str(path), "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    changed = json.loads(path.read_text())
    changed["predicate"]["buildDefinition"]["externalParameters"]["platform"] = "cuda"
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    bad = run_kit("verify", str(tmp_path / "changed.json"))
    assert bad.returncode == 1 and LABEL in bad.stdout, bad.stdout


def write_keypair(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key, pem = Ed25519PrivateKey.generate(), serialization.Encoding.PEM
    directory.mkdir(parents=True)
    (directory / "build.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
    (directory / "build.pub").write_bytes(key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    return directory / "build.key", directory / "build.pub"


def test_a_signed_provenance_verifies_and_a_changed_field_fails(cpu_image, kit_workspace, tmp_path):
    priv, pub = write_keypair(tmp_path / "keys")
    proc = run_kit(*smoke_args(cpu_image, kit_workspace), "--sign-key", str(priv))
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = Path(json.loads(proc.stdout)["provenance"]["path"])
    envelope = envelope_path(path)
    assert json.loads(envelope.read_text())["payloadType"] == "application/vnd.in-toto+json"
    ok = run_kit("verify", "--key", str(pub), str(path), "--json")
    assert ok.returncode == 0 and "trust trusted" in ok.stdout, ok.stdout + ok.stderr
    changed = json.loads(path.read_text())
    changed["predicate"]["buildDefinition"]["resolvedDependencies"][0]["uri"] = "rlk-kit/debian-base:elsewhere"
    (tmp_path / path.name).write_text(json.dumps(changed))
    shutil.copy(envelope, tmp_path / envelope.name)
    bad = run_kit("verify", "--json", str(tmp_path / path.name))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    pointers = [p["pointer"] for p in json.loads(bad.stdout)["results"][0]["problems"]]
    assert "/signatures/0" in pointers and "/payload" in pointers, bad.stdout


def test_verify_image_checks_the_provenance(cpu_image, kit_workspace):
    proc = run_kit("verify", "--image", cpu_image.tag, "--arm", "smoke", "--json", env={"KIT_WORKSPACE": str(kit_workspace)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = json.loads(proc.stdout)["results"][0]["notes"]
    assert any("provenance" in n and ".provenance.json" in n for n in notes), notes


def test_base_image_script_twice_gives_the_same_id(docker_engine):
    ids = []
    for tag in ("rlk-kit/debian-base:repro-test-a", "rlk-kit/debian-base:repro-test-b"):
        proc = subprocess.run([str(REPO / "docker" / "make-base-image.sh"), tag], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ids.append(docker_engine.images.get(tag).id)
    try:
        assert ids[0] == ids[1]
        packages = docker_engine.containers.run(ids[0], ["cat", "/etc/rlk-kit/base-packages.tsv"], remove=True).decode()
        rows = [line.split("\t") for line in packages.splitlines()]
        assert rows and all(len(row) == 3 and len(row[2]) == 64 for row in rows), rows[:5]
    finally:
        for tag in ("rlk-kit/debian-base:repro-test-a", "rlk-kit/debian-base:repro-test-b"):
            docker_engine.images.remove(tag, noprune=True)


def test_check_reproducible_rebuilds_elsewhere_to_the_same_id(cpu_image, kit_workspace):
    # Two cold builds: the first in the tests' workspace with --no-cache, the second (the check's) in a
    # fresh scratch workspace, also without the cache; both must give the session image's id.
    proc = run_kit(*smoke_args(cpu_image, kit_workspace), "--no-cache", "--check-reproducible")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    check = result["reproducibility_check"]
    assert result["image_id"] == cpu_image.image_id, (result["image_id"], cpu_image.image_id)
    assert check["same"] and check["second_image_id"] == cpu_image.image_id, check
    assert check["umask"] == "0027" and check["tz"] == "Pacific/Chatham"
