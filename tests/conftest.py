"""Shared fixtures: a real Docker engine, the smoke base image, fixture sources and the CPU smoke image.

``docker_engine`` (session) makes sure an engine answers (scripts/ensure-docker.sh starts dockerd
when none does and makes the base image when it is missing) and returns a docker-py client.
``cpu_image`` (session) builds the smoke CPU image once, from fixture repositories made in a temp
directory and passed with ``--source``; every Docker test reuses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Tests that use these fixtures need a Docker engine or start a Ray head: they carry the marker, so
# `pytest -m "not docker and not ray and not slow"` is the fast edit loop; ./scripts/test runs them all.
MARKER_FIXTURES = {"docker": {"docker_engine", "cpu_image"}, "ray": {"ray_head"}}
# Whole modules that are slow on 2 cores: the GPU kernels' CPU twins run Triton's interpreter.
SLOW_MODULES = {"test_gpu_twins.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, fixtures in MARKER_FIXTURES.items():
            if fixtures & set(getattr(item, "fixturenames", ())):
                item.add_marker(marker)
        if item.path.name in SLOW_MODULES:
            item.add_marker("slow")


def kit_version() -> str:
    from kit import __version__
    return __version__


def seal_test_run(run_dir: Path, run_id: str, *, validation_passed: bool = True, gate_set_version: str = "g/1",
                  sign_key: Path | None = None, arm: str = "smoke") -> dict:
    """Seal a run dir as kit run does: validation.json and status.json (unless written), then the seal."""
    from kit.evidence import bundle as E

    finish_test_run(run_dir, run_id, validation_passed=validation_passed, gate_set_version=gate_set_version, arm=arm)
    return E.seal_run_dir(run_dir, run_id=run_id, validation_passed=validation_passed,
                          gate_set_version=gate_set_version, sign_key=sign_key)


def finish_test_run(run_dir: Path, run_id: str, *, validation_passed: bool = True, gate_set_version: str = "g/1",
                    arm: str = "smoke") -> None:
    """validation.json and status.json of a run that succeeded (each unless already written)."""
    from kit.evidence import bundle as E

    if not (run_dir / E.VALIDATION).exists():
        summary = dict.fromkeys(("last_reward", "mismatch_count_total", "mismatch_count_last", "max_abs_dlogp",
                                 "mean_step_time_s")) | {"steps_expected": 0, "steps_observed": 0}
        E.write_document(run_dir, E.VALIDATION, {"schema": "rlk-kit/validation-report/v1", "gate_set_version": gate_set_version,
                                                 "run_id": run_id, "arm": arm, "passed": validation_passed, "gates": [],
                                                 "summary": summary})
    if not (run_dir / E.STATUS).exists():
        E.write_document(run_dir, E.STATUS, {"schema": "rlk-kit/run-status/v1", "run_id": run_id, "status": "succeeded",
                                             "job_status": "SUCCEEDED", "submission_id": "", "message": "",
                                             "finished_at": "2026-12-02T00:00:00.000000Z",
                                             "timing": {"total_s": 1.0, "workload_s": 1.0, "kit_s": 0.0}, "job_info": {}})


def run_manifest(arm_name: str, run_id: str, **workload) -> dict:
    """A valid run-manifest/v1 document for a catalog arm, as kit run writes one; ``workload``
    overrides fields of the arm's workload (seeds)."""
    import copy

    from kit.model.catalog import Catalog

    arm = Catalog.default().arm(arm_name)
    doc = copy.deepcopy(arm.document)
    doc["workload"].update(workload)
    return {"schema": "rlk-kit/run-manifest/v1", "run_id": run_id, "created_at": "2026-12-02T00:00:00Z",
            "kit_version": kit_version(), "arm": doc, "arm_sha256": "0" * 64,
            "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256, "document": arm.stack.document},
            "runtime": {"kind": "local"}, "image": None, "observed_identity": None,
            "host": {"hostname": "h", "platform": "p", "python": "3.11"}, "gpus": {"devices": [], "driver": None},
            "ray_cluster": None, "commands": {"train": ["python"], "entrypoint_appended": []}, "ray_job": None,
            "environment": {"job": {}, "host": {}, "redacted_names": []}, "inputs": {},
            "repository": {"allow_dirty": False, "state": {}}}


@pytest.fixture(scope="session")
def docker_engine():
    import docker

    proc = subprocess.run([str(REPO / "scripts" / "ensure-docker.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, f"scripts/ensure-docker.sh failed:\n{proc.stderr}"
    client = docker.from_env(timeout=600)
    client.ping()
    return client


@pytest.fixture(scope="session")
def kit_workspace():
    """A workspace that outlives the session, so the wheelhouse is downloaded once per machine."""
    path = Path(os.environ.get("KIT_TEST_WORKSPACE") or REPO / ".workspace" / "tests")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def smoke_source_repos(tmp_path_factory):
    """The three fixture repositories at the smoke stack's pins: {name: path}."""
    from kit.build import smoke_sources

    root = tmp_path_factory.mktemp("smoke-sources")
    return {name: smoke_sources.materialize(name, root / name) for name in smoke_sources.fixture_names()}


def run_kit(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the `kit` console entry point as a user would; returns the completed process."""
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=str(cwd or REPO))


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    image_id: str
    record: dict
    sources: dict


@pytest.fixture(scope="session")
def cpu_image(docker_engine, kit_workspace, smoke_source_repos):
    """`kit build cpu --arm smoke --source ...` once per session."""
    args = ["build", "cpu", "--arm", "smoke", "--json", "--workspace", str(kit_workspace)]
    for name, path in sorted(smoke_source_repos.items()):
        args += ["--source", f"{name}={path}"]
    proc = run_kit(*args)
    assert proc.returncode == 0, f"kit build failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    record = json.loads(proc.stdout)
    return BuiltImage(record["tag"], record["image_id"], record, smoke_source_repos)
