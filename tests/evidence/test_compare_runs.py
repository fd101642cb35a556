"""`kit compare` over runs: what is volatile, what only Ray's runtime adds, and what stays a real difference."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from kit.model.catalog import Catalog
from kit.cli.plan import select_arm
from kit.evidence.compare import compare_run_manifests, compare_arms

FREEZE = ["click==8.4.0", "numpy==2.4.6", "ray==2.60.0", "torch==2.13.0+cpu"]


def manifest(run_id: str, *, arm=None, runtime=None, freeze=FREEZE, executable="/venv/bin/python3", **observed) -> dict:
    arm = arm or Catalog.default().arm("smoke")
    identity = {"python": {"version": "3.11.7", "implementation": "CPython", "executable": executable},
                "packages": {"torch": "2.13.0+cpu", "ray": "2.60.0"}, "freeze": list(freeze),
                "hostname": f"host-{run_id}", "observed_at": run_id} | observed
    return {"run_id": run_id, "arm": copy.deepcopy(arm.document),
            "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256, "document": arm.stack.document},
            "runtime": runtime or {"kind": "local", "in_process": True}, "image": None, "observed_identity": identity}


IN_PROCESS = {"kind": "local", "in_process": True}
RAY_HEAD = {"kind": "local", "ray_head": True}
RAY_CLUSTER = {"kind": "ray", "address": "http://head:8265"}


def uncontrolled(a, b) -> list[str]:
    return [d.path for d in compare_run_manifests(a, b).uncontrolled]


def test_interpreter_path_is_volatile():
    a = manifest("r1", executable="/root/.pyenv/shims/python3")
    b = manifest("r2", runtime=RAY_HEAD, executable="/root/.pyenv/versions/3.11.7/bin/python3.11")
    result = compare_run_manifests(a, b)
    assert result.controlled and not result.differences


def test_interpreter_version_is_not_volatile():
    a = manifest("r1")
    b = manifest("r2", python={"version": "3.12.1", "implementation": "CPython", "executable": "/venv/bin/python3"})
    assert uncontrolled(a, b) == ["observed.python.version"]


@pytest.mark.parametrize("ray_side", [RAY_HEAD, RAY_CLUSTER])
def test_package_only_rays_workers_carry_is_explained(ray_side):
    a = manifest("r1", runtime=IN_PROCESS)
    b = manifest("r2", runtime=ray_side, freeze=[*FREEZE, "psutil==7.2.2"])
    for x, y in ((a, b), (b, a)):
        result = compare_run_manifests(x, y)
        assert result.controlled, [d.path for d in result.uncontrolled]
        assert any("psutil" in n and "Ray task" in n for n in result.notes)


@pytest.mark.parametrize("case", [
    # another package than the ones Ray vendors
    dict(ray_freeze=[*FREEZE, "requests==2.32.0"], other_freeze=FREEZE, other=IN_PROCESS, path="observed.freeze.requests"),
    # a vendored package, but a different version of it on both sides
    dict(ray_freeze=[*FREEZE, "psutil==7.2.2"], other_freeze=[*FREEZE, "psutil==5.9.0"], other=IN_PROCESS,
         path="observed.freeze.psutil"),
    # a vendored package present only in the run that did NOT run under Ray
    dict(ray_freeze=FREEZE, other_freeze=[*FREEZE, "psutil==7.2.2"], other=IN_PROCESS, path="observed.freeze.psutil"),
    # both runs under Ray: the extra package is a difference of their environments
    dict(ray_freeze=[*FREEZE, "psutil==7.2.2"], other_freeze=FREEZE, other=RAY_CLUSTER, path="observed.freeze.psutil"),
    # a pinned package's version: never explained
    dict(ray_freeze=[*FREEZE[:3], "torch==2.13.1+cpu", "psutil==7.2.2"], other_freeze=FREEZE, other=IN_PROCESS,
         path="observed.freeze.torch"),
])
def test_real_software_differences_stay_uncontrolled(case):
    a = manifest("r1", runtime=RAY_HEAD, freeze=case["ray_freeze"])
    b = manifest("r2", runtime=case["other"], freeze=case["other_freeze"])
    assert case["path"] in uncontrolled(a, b)
    assert not compare_run_manifests(a, b).controlled


def test_freeze_difference_names_the_package():
    a = manifest("r1")
    b = manifest("r2", freeze=[f.replace("numpy==2.4.6", "numpy==2.4.7") for f in FREEZE])
    result = compare_run_manifests(a, b)
    assert [(d.path, d.a, d.b) for d in result.uncontrolled] == [("observed.freeze.numpy", "2.4.6", "2.4.7")]


def test_mode_derived_arm_declares_operators_with_its_base():
    base = select_arm("smoke", None)
    native = select_arm("smoke", "native")
    assert native.name == "smoke-native"
    assert native.document["comparison"] == {"with": "smoke", "factors": ["operators"]}
    assert compare_arms(base, native).controlled
    result = compare_run_manifests(manifest("c1", arm=base), manifest("n1", arm=native))
    assert result.controlled and result.declared_factors == ("operators",)
    # the declaration covers only the operators: any other difference is still uncontrolled
    other = manifest("n2", arm=native)
    other["arm"]["workload"]["seed"] = 99
    assert uncontrolled(manifest("c1", arm=base), other) == ["workload.seed"]
    # --mode that changes nothing returns the arm itself, declaring nothing new
    assert select_arm("smoke", "consistency").document == base.document


def kit(*args):
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=dict(os.environ))


def test_compare_names_the_argument_that_is_not_a_run(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(manifest("r1")))
    missing = tmp_path / "missing"
    proc = kit("compare", str(run), str(missing))
    assert proc.returncode == 2 and f"argument B ({missing})" in proc.stderr and "Traceback" not in proc.stderr
    proc = kit("compare", str(missing), str(run))
    assert proc.returncode == 2 and f"argument A ({missing})" in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = kit("compare", str(empty), str(run))
    assert proc.returncode == 2 and "argument A" in proc.stderr and "manifest.json" in proc.stderr


def test_conformance_fingerprint_absent_on_one_side_is_not_measured_but_two_values_are_compared():
    a = manifest("r1", conformance_fingerprint="a" * 64)
    b = manifest("r2", runtime=RAY_HEAD)
    result = compare_run_manifests(a, b)
    assert result.controlled and any("conformance_fingerprint" in n and "not measured" in n for n in result.notes)
    c = manifest("r3", conformance_fingerprint="b" * 64)
    assert uncontrolled(a, c) == ["observed.conformance_fingerprint"]


def test_comparison_document_names_runs_that_are_no_evidence():
    from kit.evidence.compare import Comparison
    from kit.model.documents import schema_problems

    standing = {"run": "ws/runs/r2", "status": "failed", "sealed": False,
                "reason": "ws/runs/r2: status failed, not sealed; only a run that succeeded and was sealed is comparable evidence"}
    result = Comparison("r1", "r2", (), (), (), (standing,))
    assert not result.controlled and not result.uncontrolled
    doc = result.to_json()
    assert schema_problems(doc, "comparison") == [] and doc["not_comparable"] == [standing]
    arms = compare_arms(select_arm("smoke", None), select_arm("smoke", "native")).to_json()
    assert schema_problems(arms, "comparison") == [] and arms["not_comparable"] == [] and arms["controlled"]


@pytest.mark.parametrize("status, sealed, says", [
    ("interrupted", False, "status interrupted, not sealed"),
    ("failed", False, "status failed, not sealed"),
    ("detached", False, "status detached, not sealed"),
    ("succeeded", False, "status succeeded but not sealed (no seal.json)"),
    (None, False, "no readable status.json with a status"),
    ("succeeded", "failed gates", "sealed with failed gates"),
    ("succeeded", True, None),
])
def test_run_standing_names_the_run_dir_and_its_status(tmp_path, status, sealed, says):
    from kit.evidence.compare import run_standing

    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    if status:
        (run_dir / "status.json").write_text(json.dumps({"schema": "rlk-kit/run-status/v1", "status": status}))
    if sealed:
        (run_dir / "seal.json").write_text(json.dumps({"validation_passed": sealed is True}))
    standing = run_standing(run_dir)
    if says is None:
        assert standing is None
    else:
        assert standing["run"] == str(run_dir) and standing["status"] == status and standing["sealed"] is bool(sealed)
        assert standing["reason"].startswith(f"{run_dir}: {says}")
