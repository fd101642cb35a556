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

# Hypothesis: CI draws the same cases on every clone (a green run cannot turn red with no change); a
# developer explores by hand with `HYPOTHESIS_PROFILE=explore pytest ...` (or --hypothesis-profile=explore),
# and each find becomes a fixed regression case (@example) of its test. Tests set only max_examples,
# deadline and health checks; the seed policy is the profile's. Registered before any test module is
# imported, so every @settings inherits it.
def _register_hypothesis_profiles() -> None:
    from hypothesis import settings

    base = settings.get_profile("default")    # not whatever Hypothesis loaded for a CI variable
    settings.register_profile("ci", base, derandomize=True, database=None, print_blob=True)
    # random draws, the examples database on (.hypothesis/), so a find is replayed until fixed
    settings.register_profile("explore", base, derandomize=False, max_examples=1000, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


_register_hypothesis_profiles()

# Tests that use these fixtures need a Docker engine or start a Ray head: they carry the marker, so
# `pytest -m "not docker and not ray and not slow"` is the fast edit loop; ./scripts/test runs them all.
MARKER_FIXTURES = {"docker": {"docker_engine", "cpu_image"}, "ray": {"ray_head"}}
# Whole modules that are slow on 2 cores: the GPU kernels' CPU twins run Triton's interpreter, the CPU
# conformance oracle runs every layout, the distributed tests spawn gloo ranks, every fault run is a
# `kit run` stopped by a signal, the analyze fuzzing drives 500 inputs through `kit analyze`.
SLOW_MODULES = {"test_gpu_twins.py", "test_kernels.py", "test_distributed.py", "test_run_faults.py",
                "test_fuzz_analyze.py",
                # modules whose shared fixture makes sealed runs, a suite or a real pip install first
                "test_runs.py", "test_smoke_analysis.py", "test_suite.py", "test_install_from_lock.py",
                # every documented command run as written; the click tree given 2,000+ bad values
                "test_docs_commands.py", "test_help_examples.py", "test_fuzz_cli.py"}
# Single tests of more than a few seconds on 2 cores (`pytest --durations=60` lists them): whole smoke
# trainings, waits for an unreachable Ray address, re-resolving every lock, the 240-case tamper matrix,
# end-to-end `kit run`s and the fixtures that make sealed runs. The fast loop stays under 2 minutes.
SLOW_TESTS = {
    "test_a_run_id_used_beforehand_is_refused_before_anything_is_written",
    "test_a_smoke_run_has_host_monitors",
    "test_an_unreachable_ray_address_is_waited_for_once",
    "test_attach_refuses_a_run_that_was_not_detached",
    "test_bad_sign_key_is_refused_before_the_run_and_spends_no_run_id",
    "test_committed_pair_analyses_with_monitor_plots",
    "test_compare_with_a_run_that_did_not_complete_is_not_controlled",
    "test_consistency_is_bitwise_zero_for_tp2_cp4_against_rollout_tp4",
    "test_ctrl_c_stops_the_suite_and_writes_the_partial_summary",
    "test_export_reads_back_every_param_metric_and_artifact",
    "test_g10_g11_run_dirs_are_descriptive_and_name_the_uncontrolled_pins",
    "test_kit_lock_check_of_every_committed_lock_without_network_exits_2",
    "test_kit_lock_check_without_an_index_exits_2",
    "test_kit_run_of_a_gpu_arm_on_the_cpu_is_sealed_with_monitors",
    "test_local_run_seals_and_verifies",
    "test_module_entry_point",
    "test_native_mode_records_mismatch_and_passes_pp_gates",
    "test_no_secret_value_in_any_file_of_the_run_dir",
    "test_perf_on_run_dirs",
    "test_reward_improves_with_training",
    "test_rounds_csv_has_the_29_published_columns_in_order",
    "test_same_arm_twice_is_a_controlled_pair",
    "test_sigterm_keeps_partial_evidence_without_seal",
    "test_smoke_logs_analyse_with_perf",
    "test_summary_validates_and_matches_the_file",
    "test_tamper_matrix",
    "test_the_tiny_lock_is_real_and_passes_the_rules",
    "test_the_untampered_copies_verify",
    "test_two_workers_draw_the_same_bytes_as_this_process",
    "test_every_test_file_is_collected",      # a second pytest collects every module
    "test_unreachable_ray_address_is_bad_input",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, fixtures in MARKER_FIXTURES.items():
            if fixtures & set(getattr(item, "fixturenames", ())):
                item.add_marker(marker)
        if item.path.name in SLOW_MODULES or item.originalname in SLOW_TESTS:
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


@pytest.fixture(autouse=True)
def process_environment_restored():
    """Every test leaves os.environ as it found it: what a test (or a library it calls in-process, such as
    ``ray.init()``, which sets RAY_AUTH_MODE) writes there would otherwise reach every later subprocess."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


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
