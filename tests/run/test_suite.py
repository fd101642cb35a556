"""`kit suite module` on the smoke stack, end to end: the eight arms through kit run's path, the summary
document, attribution against the runs' own metrics, an existing suite id, a run id taken before or
during the suite, Ctrl-C; and the pure rules (base selection, attribution, findings)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit.model.documents import schema_problems
from kit.model.errors import BadInput
from kit.run.attribution import MODULE_ORDER, attribution, render_table
from kit.run.suite import (
    MatrixBase,
    SuiteRequest,
    plan_module_suite,
    run_id_for,
    run_module_suite,
    select_base,
)

GBS = 16   # the smoke arm's global batch size


def kit(*args, env=None, timeout=600):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "kit", *args], check=False, capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def tree_state(root: Path) -> dict[str, str]:
    """Every path under root with the sha256 of its bytes (directories as 'dir')."""
    out = {}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("suite-ws")


@pytest.fixture(scope="module")
def suite_t1(workspace):
    started = time.monotonic()
    # the group's --json (kit suite --json module ...) is the same as the subcommand's
    proc = kit("suite", "--json", "module", "--suite-id", "t1", "--rollouts", "2", "--stack", "smoke", "--allow-dirty",
               env={"KIT_WORKSPACE": str(workspace)})
    elapsed = time.monotonic() - started
    print(f"kit suite module, 8 smoke arms x 2 rollouts: {elapsed:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout), workspace


def _metrics_totals(run_dir: Path) -> tuple[float, float]:
    """Mismatch count and active tokens from the run's own metrics.jsonl (means × global batch size)."""
    mismatch = tokens = 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "step":
            mismatch += rec["payload"]["train/train_current_rollout_logprob_mismatch_count"] * GBS
            tokens += rec["payload"]["train/train_current_rollout_logprob_numel"] * GBS
    return mismatch, tokens


def test_summary_validates_and_matches_the_file(suite_t1):
    summary, workspace = suite_t1
    path = workspace / "suites" / "t1" / "summary.json"
    assert json.loads(path.read_text()) == summary
    assert schema_problems(summary, "suite-summary") == []
    assert summary["status"] == "complete" and summary["exit_code"] == 0
    assert summary["stack"]["name"] == "smoke" and len(summary["stack"]["sha256"]) == 64
    assert summary["runtime"]["kind"] == "local" and summary["rollouts"] == 2
    assert summary["counts"]["passed"] == 8
    assert sorted(p.name for p in (workspace / "suites" / "t1").iterdir()) == ["summary.json"]


def test_arms_run_in_pipeline_order_as_sealed_runs(suite_t1):
    summary, workspace = suite_t1
    arms = summary["arms"]
    assert [a["code"] for a in arms] == list(MODULE_ORDER)
    assert [a["run_id"] for a in arms] == [f"t1-smoke-{c.lower()}" for c in MODULE_ORDER]
    for a in arms:
        bits = "".join("1" if a["operators"][m] == "R/R" else "0" for m in ("attention", "ffn", "logp"))
        assert a["code"] == "M" + bits and a["arm"] == "smoke-" + a["code"]
        assert a["verdict"] == "passed" and a["sealed"] and a["gates_passed"], a
        assert Path(a["run_dir"]) == workspace / "runs" / a["run_id"]
        seal = json.loads((Path(a["run_dir"]) / "seal.json").read_text())
        assert seal["root_sha256"] == a["seal_root_sha256"]
        manifest = json.loads((Path(a["run_dir"]) / "manifest.json").read_text())
        assert manifest["arm"]["name"] == a["arm"] and manifest["arm"]["workload"]["rollouts"] == 2
        assert manifest["stack"]["sha256"] == summary["stack"]["sha256"]
    proc = kit("verify", *(a["run_dir"] for a in arms))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 8


def test_mismatch_totals_come_from_each_run(suite_t1):
    summary, _ = suite_t1
    by_code = {a["code"]: a for a in summary["arms"]}
    for a in summary["arms"]:
        mismatch, tokens = _metrics_totals(Path(a["run_dir"]))
        fig = a["figures"]
        assert fig["steps"] == 2
        assert fig["bitwise_mismatch_count"] == mismatch and fig["active_tokens"] == tokens
        assert fig["mean_step_time_s"] > 0
    assert by_code["M111"]["figures"]["bitwise_mismatch_count"] == 0
    assert by_code["M111"]["figures"]["max_abs_dlogp"] == 0
    assert by_code["M000"]["figures"]["bitwise_mismatch_count"] > 0
    assert by_code["M000"]["figures"]["max_abs_dlogp"] > 0


def test_attribution_is_consistent_with_the_arm_totals(suite_t1):
    summary, _ = suite_t1
    total = {a["code"]: a["figures"]["bitwise_mismatch_count"] for a in summary["arms"]}
    att = summary["attribution"]
    assert [m["module"] for m in att["modules"]] == ["attention", "ffn", "logp"]
    for index, m in enumerate(att["modules"]):
        rr = [c for c in MODULE_ORDER if c[1 + index] == "1"]
        assert m["rr_arms"] == rr and m["rr_total"] == sum(total[c] for c in rr)
        assert m["pp_total"] == sum(total[c] for c in MODULE_ORDER if c[1 + index] == "0")
        assert len(m["pairs"]) == 4
        for p in m["pairs"]:
            assert p["from"][1 + index] == "0" and p["to"][1 + index] == "1"
            assert p["from"][:1 + index] + p["from"][2 + index:] == p["to"][:1 + index] + p["to"][2 + index:]
            assert p["delta"] == total[p["to"]] - total[p["from"]]
        assert m["mean_marginal_effect"] == pytest.approx((m["rr_total"] - m["pp_total"]) / 4)
        assert m["alone_makes_zero"] == (total[m["alone_arm"]] == 0)
    assert [p["to"] for p in att["modules"][0]["pairs"]] == ["M100", "M110", "M101", "M111"]
    assert att["zero_arms"] == [c for c in MODULE_ORDER if total[c] == 0]
    assert att["all_rr_exactly_zero"] is True
    assert any("smoke-M111 is exactly zero" in f for f in att["findings"])
    vanish = [f for f in att["findings"] if "alone" in f]
    assert len(vanish) == 1
    assert ("no module alone" in vanish[0]) == (att["alone_make_zero"] == [])


def test_an_existing_suite_id_changes_nothing(suite_t1):
    _, workspace = suite_t1
    before = tree_state(workspace)
    proc = kit("suite", "module", "--suite-id", "t1", "--rollouts", "2", "--stack", "smoke", "--allow-dirty",
               env={"KIT_WORKSPACE": str(workspace)})
    assert proc.returncode == 2
    assert "--suite-id t1" in proc.stderr and "already exists" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_state(workspace) == before


def test_a_run_id_used_beforehand_is_refused_before_anything_is_written(suite_t1):
    _, workspace = suite_t1
    # a hand-started run that happens to carry the id the suite would give its M010 arm
    proc = kit("run", "--arm", "smoke", "--rollouts", "1", "--run-id", "t9-smoke-m010", "--allow-dirty",
               env={"KIT_WORKSPACE": str(workspace)})
    assert proc.returncode == 0, proc.stderr
    before = tree_state(workspace)
    proc = kit("suite", "module", "--suite-id", "t9", "--rollouts", "2", "--stack", "smoke", "--allow-dirty",
               env={"KIT_WORKSPACE": str(workspace)})
    assert proc.returncode == 2
    assert "t9-smoke-m010" in proc.stderr and "pick a new suite id" in proc.stderr
    assert tree_state(workspace) == before
    assert not (workspace / "suites" / "t9").exists()


def test_an_arm_that_fails_is_recorded_and_the_suite_continues(tmp_path, capsys):
    """The M100 run id is claimed by another run between planning and that arm's start (as a
    concurrent ``kit run`` would): kit run refuses it, the suite records it and runs the other seven."""
    from kit.evidence import bundle as E

    plan = plan_module_suite(SuiteRequest(suite_id="t2", rollouts=1, stack="smoke", workspace=tmp_path,
                                          allow_dirty=True))
    started = []

    def before_arm(spec):
        started.append(spec.code)
        if spec.code == "M100":
            E.create_run_dir(tmp_path, spec.run_id)

    summary, code = run_module_suite(plan, before_arm=before_arm)
    assert code == 1 and summary["exit_code"] == 1 and summary["status"] == "complete"
    assert started == list(MODULE_ORDER)
    assert json.loads((tmp_path / "suites" / "t2" / "summary.json").read_text()) == summary
    assert schema_problems(summary, "suite-summary") == []
    by_code = {a["code"]: a for a in summary["arms"]}
    failed = by_code["M100"]
    assert failed["verdict"] == "failed" and not failed["sealed"] and failed["run_dir"] is None
    assert "t2-smoke-m100" in failed["reason"] and "already used" in failed["reason"]
    assert failed["figures"] is None
    assert [c for c, a in by_code.items() if a["verdict"] == "passed"] == [c for c in MODULE_ORDER if c != "M100"]
    assert summary["counts"] == {"passed": 7, "gates_failed": 0, "failed": 1, "interrupted": 0, "not_run": 0}
    attention = summary["attribution"]["modules"][0]
    assert attention["pairs"][0]["delta"] is None and attention["pairs"][1]["delta"] is not None
    assert attention["mean_marginal_effect"] is None and attention["alone_makes_zero"] is None
    assert summary["attribution"]["all_rr_exactly_zero"] is True
    assert any("incomplete" in f and "smoke-M100" in f for f in summary["attribution"]["findings"])
    table = render_table(summary)
    assert "smoke-M100" in table and "already used" in table and "M000→M100 -" in table


def test_ctrl_c_stops_the_suite_and_writes_the_partial_summary(tmp_path):
    # the signal lands after the second arm's first step of twenty: that run stops, the suite stops
    env = dict(os.environ, KIT_WORKSPACE=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "kit", "suite", "module", "--suite-id", "t3", "--rollouts", "20",
                             "--stack", "smoke", "--allow-dirty"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    second = tmp_path / "runs" / "t3-smoke-m100" / "run.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (second.exists() and "step 0:" in second.read_text()):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "suites" / "t3" / "summary.json").read_text())
    assert schema_problems(summary, "suite-summary") == []
    assert summary["status"] == "interrupted" and summary["interrupted"] and summary["exit_code"] == 130
    verdicts = [a["verdict"] for a in summary["arms"]]
    assert verdicts == ["passed", "interrupted"] + ["not_run"] * 6
    assert not (tmp_path / "runs" / "t3-smoke-m100" / "seal.json").exists()
    assert not (tmp_path / "runs" / "t3-smoke-m010").exists()
    assert "INTERRUPTED" in out


def test_sigterm_just_after_an_arm_sealed_stops_the_suite_before_the_next_arm(tmp_path):
    # held once the first arm's run has sealed (KIT_TEST_HOLD_AT=sealed), still inside kit run: the signal
    # lands on the run's own flag, and the suite must stop all the same (it went on once, and said "complete")
    env = dict(os.environ, KIT_WORKSPACE=str(tmp_path), KIT_TEST_HOLD_AT="sealed")
    proc = subprocess.Popen([sys.executable, "-m", "kit", "suite", "module", "--suite-id", "t4", "--rollouts", "2",
                             "--stack", "smoke", "--allow-dirty"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = ""
    while "test hold at sealed" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "the suite ended without holding"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "suites" / "t4" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["exit_code"] == 130 and proc.returncode == 130, out + err
    assert [a["verdict"] for a in summary["arms"]] == ["passed"] + ["not_run"] * 7
    assert not (tmp_path / "runs" / "t4-smoke-m100").exists()


# --- pure rules ------------------------------------------------------------------------------------

BASES = [MatrixBase("consistency", "", "vime-current", "vime"), MatrixBase("smoke", "smoke-", "smoke", "smoke")]


def test_base_selection():
    assert select_base(BASES, "smoke", None) == (BASES[1], "local")
    assert select_base(BASES, "vime-current", None) == (BASES[0], "docker")
    assert select_base(BASES, "smoke", "docker") == (BASES[1], "docker")
    assert select_base(BASES, None, "local") == (BASES[1], "local")
    for stack, runtime, named in ((None, None, "--stack is required"), (None, "docker", "--stack is required"),
                                  ("nope", None, "--stack nope"), ("vime-current", "local", "--runtime local")):
        with pytest.raises(BadInput, match=named):
            select_base(BASES, stack, runtime)


def test_run_ids_carry_only_the_suite_id_and_arm():
    assert run_id_for("t1", "smoke-M100") == "t1-smoke-m100"
    assert run_id_for("nightly.3", "M011") == "nightly.3-m011"


def _arms(totals: dict[str, float], max_diff: float = 1e-6) -> list[dict]:
    return [{"code": c, "arm": c, "figures": {"bitwise_mismatch_count": totals[c],
                                              "max_abs_dlogp": 0.0 if totals[c] == 0 else max_diff}}
            for c in MODULE_ORDER]


def test_attribution_names_a_module_that_alone_makes_the_mismatch_vanish():
    # a world where only logp matters: every arm with logp R/R is zero
    totals = {c: (0 if c[3] == "1" else 10 + i) for i, c in enumerate(MODULE_ORDER)}
    att = attribution(_arms(totals))
    assert att["alone_make_zero"] == ["logp"]
    logp = att["modules"][2]
    assert [p["delta"] for p in logp["pairs"]] == [-totals[p["from"]] for p in logp["pairs"]]
    assert logp["needed_for_zero"] is True and att["modules"][0]["needed_for_zero"] is False
    assert att["all_rr_exactly_zero"] is True
    assert any(f.startswith("switching only logp to R/R makes the mismatch vanish") for f in att["findings"])
    assert any("zero mismatch needs logp R/R" in f for f in att["findings"])


def test_all_rr_with_a_nonzero_max_diff_is_not_exactly_zero():
    totals = {c: 5 for c in MODULE_ORDER}
    totals["M111"] = 0
    arms = _arms(totals)
    arms[-1]["figures"]["max_abs_dlogp"] = 1e-9    # equal counts, different values: not bitwise
    att = attribution(arms)
    assert att["all_rr_exactly_zero"] is False
    assert any("M111 is NOT zero" in f for f in att["findings"])


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.just(""), st.text(min_size=1, max_size=12).filter(
    lambda s: not (s[0].isascii() and s[0].isalnum() and all(c.isascii() and (c.isalnum() or c in "._-") for c in s)))))
def test_bad_suite_ids_are_refused_and_create_nothing(tmp_path_factory, suite_id):
    ws = tmp_path_factory.mktemp("bad")
    with pytest.raises(BadInput, match="--suite-id"):
        plan_module_suite(SuiteRequest(suite_id=suite_id, rollouts=2, stack="smoke", workspace=ws, allow_dirty=True))
    assert list(ws.iterdir()) == []


@pytest.mark.parametrize("args, named", [
    (["--rollouts", "0", "--stack", "smoke"], "--rollouts"),
    (["--rollouts", "2"], "--stack is required"),
    (["--rollouts", "2", "--stack", "vime-current", "--runtime", "local"], "--runtime local"),
    (["--rollouts", "2", "--stack", "smoke", "--runtime", "ray"], "--ray-address"),
    # kit run would refuse each of the eight arms for it; the suite refuses it once, before anything exists
    (["--rollouts", "2", "--stack", "smoke", "--image", "x:y"], "--image needs --runtime docker"),
    (["--rollouts", "2", "--stack", "smoke", "--runtime", "ray", "--ray-address", "head:8265"],
     "--ray-address 'head:8265': scheme 'head' is not http or https; give the dashboard's URL"),
])
def test_bad_flags_exit_2_and_write_nothing(tmp_path, args, named):
    proc = kit("suite", "module", "--suite-id", "b1", *args, "--allow-dirty", env={"KIT_WORKSPACE": str(tmp_path)})
    assert proc.returncode == 2 and named in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


# --- the runtime's inputs, checked once before the suite dir exists --------------------------------

def test_an_absent_image_is_bad_input_before_the_suite_starts(tmp_path, docker_engine):
    started = time.monotonic()
    proc = kit("suite", "module", "--suite-id", "s3", "--rollouts", "1", "--stack", "smoke", "--runtime", "docker",
               "--image", "rlk-kit/nonexistent:tag", "--allow-dirty", env={"KIT_WORKSPACE": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--image rlk-kit/nonexistent:tag" in proc.stderr and "not on this engine" in proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 60
    assert list(tmp_path.iterdir()) == []       # no suite dir, no run dirs: the suite id is still free


def test_no_docker_engine_is_bad_input_before_the_suite_starts(tmp_path):
    proc = kit("suite", "module", "--suite-id", "s4", "--rollouts", "1", "--stack", "smoke", "--runtime", "docker",
               "--allow-dirty", env={"KIT_WORKSPACE": str(tmp_path), "DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert proc.returncode == 2 and "no Docker engine answers" in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_an_image_of_another_stack_fails_before_the_suite_starts(tmp_path, docker_engine):
    import io
    import uuid

    tag = f"rlk-kit-test/not-smoke:{uuid.uuid4().hex[:8]}"
    image, _ = docker_engine.images.build(fileobj=io.BytesIO(f"FROM scratch\nLABEL x={tag}\n".encode()), tag=tag, rm=True)
    try:
        proc = kit("suite", "module", "--suite-id", "s5", "--rollouts", "1", "--stack", "smoke", "--runtime", "docker",
                   "--image", tag, "--allow-dirty", env={"KIT_WORKSPACE": str(tmp_path)})
    finally:
        docker_engine.images.remove(image.id, force=True)
    # as kit run: a check failed (exit 1), but once and with nothing written
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"--image {tag}: not built for stack smoke" in proc.stderr and "/opt/rlk/stack.json" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_docker_suite_pins_one_image_for_all_arms(tmp_path, cpu_image):
    """The image is resolved once while planning (as kit run resolves it) and every arm is handed its id."""
    from kit.adapters.docker import ref_of
    from kit.run.suite import _run_request

    plan = plan_module_suite(SuiteRequest(suite_id="p1", rollouts=1, stack="smoke", runtime="docker",
                                          image=cpu_image.tag, workspace=tmp_path, allow_dirty=True))
    assert (plan.image, plan.image_id) == (cpu_image.tag, cpu_image.image_id)
    assert {_run_request(plan.request, plan.runtime, plan.workspace, s, plan.image_id).image
            for s in plan.specs} == {cpu_image.image_id}
    # without --image: the runtime's own choice among the smoke stack's images, named by its tag
    chosen = plan_module_suite(SuiteRequest(suite_id="p2", rollouts=1, stack="smoke", runtime="docker",
                                            workspace=tmp_path, allow_dirty=True))
    image = cpu_image_client().images.get(chosen.image_id)
    assert image.labels["dev.rlk-kit.stack.sha256"] == plan.stack_sha256
    assert chosen.image == ref_of(image)
    assert list(tmp_path.iterdir()) == []     # planning writes nothing


def cpu_image_client():
    import docker

    return docker.from_env()


def test_an_unreachable_ray_address_is_waited_for_once(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]      # nothing listens on it once closed
    started = time.monotonic()
    proc = kit("suite", "module", "--suite-id", "s6", "--rollouts", "1", "--stack", "smoke", "--runtime", "ray",
               "--ray-address", f"http://127.0.0.1:{port}", "--allow-dirty", env={"KIT_WORKSPACE": str(tmp_path)})
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--ray-address http://127.0.0.1:{port}: cannot be reached" in proc.stderr
    assert elapsed < 60, elapsed      # one wait of the runtime's 20 s, not one per arm
    assert list(tmp_path.iterdir()) == []


def test_a_bad_signing_key_is_refused_once_before_any_arm(tmp_path):
    key = tmp_path / "not-a-key.pem"
    key.write_text("not a key")
    ws = tmp_path / "ws"
    proc = kit("suite", "module", "--suite-id", "k1", "--rollouts", "1", "--stack", "smoke", "--allow-dirty",
               "--sign-key", str(key), env={"KIT_WORKSPACE": str(ws)})
    assert proc.returncode == 2 and "--sign-key" in proc.stderr and "Traceback" not in proc.stderr
    assert not ws.exists() or list(ws.iterdir()) == []


def test_json_is_offered_by_the_group_and_the_subcommand():
    for args in (["suite", "--help"], ["suite", "module", "--help"]):
        proc = kit(*args)
        assert proc.returncode == 0 and "--json" in proc.stdout and "rlk-kit/suite-summary/v1" in proc.stdout


def test_verdicts_from_kit_run_outcomes():
    from kit.model.catalog import Catalog
    from kit.run.request import RunOutcome
    from kit.run.suite import SuiteArm, arm_entry

    spec = SuiteArm("M000", Catalog.default().arm("smoke-M000"), "v1-smoke-m000")
    gates = [{"id": "steps-once", "status": "failed"}, {"id": "no-oom", "status": "passed"}]
    seal = {"root_sha256": "a" * 64}
    cases = [
        (RunOutcome("v1", Path("/r"), "succeeded", "SUCCEEDED", {"passed": True, "gates": []}, seal), "passed", None),
        (RunOutcome("v1", Path("/r"), "succeeded", "SUCCEEDED", {"passed": False, "gates": gates}, seal,
                    "gates failed: steps-once"), "gates_failed", "gates failed: steps-once"),
        (RunOutcome("v1", Path("/r"), "failed", "FAILED", {"passed": False, "gates": gates}, None, "job ended FAILED"),
         "failed", "job ended FAILED"),
        (RunOutcome("v1", Path("/r"), "interrupted", "STOPPED", None, None, "stopped by signal SIGINT"),
         "interrupted", "stopped by signal SIGINT"),
    ]
    for outcome, verdict, reason in cases:
        entry = arm_entry(spec, outcome=outcome)
        assert (entry["verdict"], entry["reason"]) == (verdict, reason)
        assert entry["sealed"] == (outcome.seal is not None)
    assert arm_entry(spec, outcome=cases[1][0])["failed_gates"] == ["steps-once"]
