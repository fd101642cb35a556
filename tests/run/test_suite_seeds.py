"""`kit suite module --seeds`: one sealed suite per seed, each arm's runs grouped over the seeds, and the
groups read by `kit analyze replicates`; a taken group id or a bad --seeds is refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.model.documents import schema_problems
from kit.run.attribution import MODULE_ORDER


def kit(*args, workspace: Path, timeout=1800):
    env = dict(os.environ, KIT_WORKSPACE=str(workspace))
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def seeded_suite(tmp_path_factory):
    ws = tmp_path_factory.mktemp("suite-seeds")
    proc = kit("suite", "--json", "module", "--suite-id", "r1", "--rollouts", "1", "--stack", "smoke", "--seeds", "1,2",
               "--allow-dirty", workspace=ws)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return ws, json.loads(proc.stdout)


@pytest.mark.slow
def test_one_sealed_suite_per_seed(seeded_suite):
    ws, summaries = seeded_suite
    assert [s["suite_id"] for s in summaries] == ["r1-s1", "r1-s2"]
    for seed, summary in zip((1, 2), summaries):
        assert schema_problems(summary, "suite-summary") == []
        assert json.loads((ws / "suites" / summary["suite_id"] / "summary.json").read_text()) == summary
        assert [a["code"] for a in summary["arms"]] == list(MODULE_ORDER)
        for arm in summary["arms"]:
            assert arm["verdict"] == "passed" and arm["sealed"]
            manifest = json.loads((Path(arm["run_dir"]) / "manifest.json").read_text())
            assert manifest["arm"]["workload"]["seed"] == seed == manifest["arm"]["workload"]["rollout_seed"]
            assert arm["run_id"] == f"r1-s{seed}-{arm['arm'].lower()}"


@pytest.mark.slow
def test_each_arm_is_a_group_over_the_seeds(seeded_suite, tmp_path):
    ws, summaries = seeded_suite
    names = [a["arm"] for a in summaries[0]["arms"]]
    for name in names:
        group = json.loads((ws / "groups" / f"r1-{name.lower()}.json").read_text())
        assert schema_problems(group, "replicate-group") == []
        assert group["arm"] == name and group["seeds"] == [1, 2]
        assert [(r["seed"], r["sealed"], r["status"]) for r in group["runs"]] == [(1, True, "succeeded"),
                                                                                  (2, True, "succeeded")]
        assert [r["run_dir"] for r in group["runs"]] == [next(a["run_dir"] for a in s["arms"] if a["arm"] == name)
                                                         for s in summaries]
    first, last = (ws / "groups" / f"r1-{n.lower()}.json" for n in (names[0], names[-1]))
    proc = kit("analyze", "replicates", str(first), str(last), "--out", str(tmp_path / "noise"), "--draws", "200",
               workspace=ws)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "noise" / "replicates.json").read_text())
    assert [(a["arm"], [r["seed"] for r in a["runs"]]) for a in doc["arms"]] == [(names[0], [1, 2]), (names[-1], [1, 2])]


def test_a_taken_group_or_bad_seeds_are_refused_before_anything_runs(tmp_path):
    (tmp_path / "groups").mkdir()
    (tmp_path / "groups" / "r9-smoke-m000.json").write_text("{}")
    proc = kit("suite", "module", "--suite-id", "r9", "--rollouts", "1", "--stack", "smoke", "--seeds", "1,2",
               "--allow-dirty", workspace=tmp_path)
    assert proc.returncode == 2 and "r9-smoke-m000.json already exists" in proc.stderr
    assert not (tmp_path / "suites").exists() and not (tmp_path / "runs").exists()
    proc = kit("suite", "module", "--suite-id", "r8", "--rollouts", "1", "--stack", "smoke", "--seeds", "1,1",
               "--allow-dirty", workspace=tmp_path)
    assert proc.returncode == 2 and "--seeds" in proc.stderr and "Traceback" not in proc.stderr
