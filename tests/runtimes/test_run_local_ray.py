"""`kit run --arm smoke --ray-head`: the smoke arm as a Ray job on a head the kit starts and stops."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import run_kit


def ray_heads() -> int:
    out = subprocess.run(["pgrep", "-f", "start --head --block"], capture_output=True, text=True).stdout
    return len(out.split())


@pytest.mark.ray
def test_smoke_as_a_ray_job_on_a_local_head(tmp_path):
    before = ray_heads()
    proc = run_kit("run", "--arm", "smoke", "--ray-head", "--rollouts", "3", "--workspace", str(tmp_path),
                   "--allow-dirty", "--run-id", "local-ray-1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""                                         # --json: no Ray SDK chatter ("Uploading package")
    run_dir = tmp_path / "runs" / "local-ray-1"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["runtime"]["kind"] == "local" and manifest["runtime"]["ray_head"] is True
    start = manifest["ray_cluster"]["start_command"]
    assert start[1:6] == ["-m", "ray.scripts.scripts", "start", "--head", "--block"] and "--disable-usage-stats" in start
    assert len(manifest["ray_cluster"]["nodes"]) == 1
    assert manifest["commands"]["train"][-1] == "--ray"              # rollout and trainer as Ray actors
    assert manifest["commands"]["ray_start"] == start
    assert manifest["ray_job"]["submission_id"] == "rlk-local-ray-1"   # the job went through the Jobs API
    log = (run_dir / "run.log").read_text()
    assert "step 2:" in log and "Uploading package" not in log
    assert run_kit("verify", str(run_dir)).returncode == 0
    assert ray_heads() == before                                     # the head the kit started is gone

    # the same arm in-process: the interpreter path and what Ray's workers add are no software difference
    inproc = run_kit("run", "--arm", "smoke", "--rollouts", "3", "--workspace", str(tmp_path), "--allow-dirty",
                     "--run-id", "in-process-1", "--json")
    assert inproc.returncode == 0, inproc.stderr[-3000:]
    cmp = run_kit("compare", "--json", str(tmp_path / "runs" / "in-process-1"), str(run_dir))
    doc = json.loads(cmp.stdout)
    assert cmp.returncode == 0 and doc["controlled"], [d for d in doc["differences"] if d["status"] == "uncontrolled"]
