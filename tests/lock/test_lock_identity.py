"""The lock as its own field of a run's identity: run-manifest/v2 ``lock``, seal/v3 ``lock_sha256``
cross-checked by kit verify, and kit compare holding runs of different locks uncontrolled."""

from __future__ import annotations

import copy
import os

from conftest import run_manifest, seal_test_run
from kit.evidence import bundle as E
from kit.evidence.audit import in_toto_statement, verify_run_dir
from kit.evidence.compare import compare_run_manifests
from kit.model.catalog import Catalog
from kit.model.documents import dumps_pretty, schema_problems
from kit.model.lock import lock_sha256
from kit.run.manifest import lock_record


def _v2(arm: str, run_id: str, lock: dict | None) -> dict:
    doc = run_manifest(arm, run_id)
    doc["schema"] = "rlk-kit/run-manifest/v2"
    doc["lock"] = lock
    assert schema_problems(doc, "run-manifest") == []
    return doc


def _lock(sha: str) -> dict:
    return {"sha256": sha, "stack": "smoke", "platform": "cpu", "source": "image-label"}


def test_the_lock_comes_from_the_image_label_or_the_stacks_committed_lock():
    catalog = Catalog.default()
    smoke = catalog.stack("smoke")
    image = {"ref": "rlk-kit/smoke:cpu-x", "id": "sha256:" + "1" * 64,
             "labels": {"dev.rlk-kit.lock.sha256": "a" * 64, "dev.rlk-kit.platform": "cpu"}}
    assert lock_record("smoke", smoke.sha256, image) == _lock("a" * 64) | {"installed": True}
    assert lock_record("smoke", smoke.sha256, dict(image, labels={})) is None   # an image built without a lock
    committed = lock_sha256(catalog.lock("smoke", "cpu")[0])
    assert lock_record("smoke", smoke.sha256, None) == {"sha256": committed, "stack": "smoke", "platform": "cpu",
                                                         "source": "committed-lock", "installed": False}
    assert lock_record("smoke", "0" * 64, None) is None        # not the catalog's stack: its lock is not this one's
    assert lock_record("gpu-h200", catalog.stack("gpu-h200").sha256, None) is None   # revision 1 has no lock


def test_the_seal_carries_the_lock_and_verify_cross_checks_it(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    E.write_document(run_dir, E.MANIFEST, _v2("smoke", "r1", _lock("b" * 64)))
    seal = seal_test_run(run_dir, "r1")
    assert seal["schema"] == "rlk-kit/seal/v3" and seal["lock_sha256"] == "b" * 64
    assert verify_run_dir(run_dir).status == "ok", verify_run_dir(run_dir).problems
    statement = in_toto_statement(seal)
    assert statement["predicate"]["lock_sha256"] == "b" * 64
    assert schema_problems(statement, as_schema="rlk-kit/in-toto-run-seal/v3") == []
    # The seal's lock edited (and its whole-seal hash recomputed, as a forger would): the manifest disagrees.
    forged = copy.deepcopy(seal)
    forged["lock_sha256"] = "c" * 64
    forged["seal_sha256"] = E.seal_sha256(forged)
    seal_path = run_dir / E.SEAL
    os.chmod(seal_path, 0o644)
    seal_path.write_bytes(dumps_pretty(forged).encode())
    verdict = verify_run_dir(run_dir)
    assert verdict.status == "fail"
    assert any("lock_sha256" in p and "c" * 12 in m for p, m in verdict.problems), verdict.problems


def test_an_older_manifest_seals_no_lock():
    doc = run_manifest("smoke", "r0")
    assert doc["schema"] == "rlk-kit/run-manifest/v1" and "lock" not in doc


def test_runs_of_different_locks_are_not_controlled():
    a = _v2("smoke", "a", _lock("d" * 64))
    b = _v2("smoke", "b", _lock("e" * 64))
    assert [d.path for d in compare_run_manifests(a, a).uncontrolled] == []
    result = compare_run_manifests(a, b)
    assert [d.path for d in result.uncontrolled] == ["lock.sha256"]
    assert not result.controlled
