"""`kit run --arm smoke --ray-head`: the smoke arm as a Ray job on a head the kit starts and stops."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import run_kit
from kit.model.errors import BadInput
from kit.runtimes.local_ray import local_head_auth


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


def test_the_local_heads_auth_mode_is_explicit(tmp_path):
    assert local_head_auth({}, str(tmp_path)) == {"RAY_AUTH_MODE": "disabled"}
    assert local_head_auth({"RAY_AUTH_MODE": "disabled"}, str(tmp_path)) == {"RAY_AUTH_MODE": "disabled"}
    assert local_head_auth({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t"}, str(tmp_path)) == {"RAY_AUTH_MODE": "token"}
    with pytest.raises(BadInput, match="RAY_AUTH_MODE=token.*RAY_AUTH_TOKEN_PATH.*ray get-auth-token --generate"):
        local_head_auth({"RAY_AUTH_MODE": "token"}, str(tmp_path))
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("a" * 32)
    assert local_head_auth({"RAY_AUTH_MODE": "TOKEN"}, str(tmp_path)) == \
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


@pytest.mark.ray
def test_token_auth_in_the_environment_reaches_the_local_head(tmp_path):
    """RAY_AUTH_MODE=token (set by the user, or by an earlier ray.init() in the same shell): the kit's head,
    which has a HOME of its own, still gets the user's token; with no token at all, exit 2 and no run."""
    home = tmp_path / "home"
    none = run_kit("run", "--arm", "smoke", "--ray-head", "--rollouts", "1", "--workspace", str(tmp_path / "ws"),
                   "--allow-dirty", "--run-id", "no-token", env={"RAY_AUTH_MODE": "token", "HOME": str(home)})
    assert none.returncode == 2, none.stderr[-3000:]
    assert "RAY_AUTH_MODE=token" in none.stderr and "Traceback" not in none.stderr
    assert not (tmp_path / "ws" / "runs" / "no-token").exists()

    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0123456789abcdef" * 4)
    ok = run_kit("run", "--arm", "smoke", "--ray-head", "--rollouts", "1", "--workspace", str(tmp_path / "ws"),
                 "--allow-dirty", "--run-id", "with-token", env={"RAY_AUTH_MODE": "token", "HOME": str(home)})
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert run_kit("verify", str(tmp_path / "ws" / "runs" / "with-token")).returncode == 0


@pytest.mark.ray
def test_an_exported_ray_address_that_answers_nothing_does_not_redirect_the_kits_own_head(tmp_path):
    # most Ray hosts export RAY_ADDRESS; Ray's SDK prefers it to the address it is given
    proc = run_kit("run", "--arm", "smoke", "--ray-head", "--rollouts", "2", "--workspace", str(tmp_path),
                   "--allow-dirty", "--run-id", "exported-1", env={"RAY_ADDRESS": "http://127.0.0.1:1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    manifest = json.loads((tmp_path / "runs" / "exported-1" / "manifest.json").read_text())
    assert manifest["ray_job"]["submission_id"] == "rlk-exported-1"


def test_the_local_head_gets_a_distinct_port_per_component():
    # ports picked one at a time can come back equal; Ray then refuses the head (two components on one port)
    from kit.runtimes.base import free_ports
    from kit.runtimes.local_ray import HEAD_PORT_FLAGS, ray_start_command
    for _ in range(50):
        ports = free_ports(HEAD_PORT_FLAGS)
        assert len(set(ports.values())) == len(HEAD_PORT_FLAGS)
    argv = ray_start_command("/tmp/x", ports, 2)
    assert [a for a in argv if a.split("=")[0] in HEAD_PORT_FLAGS] == [f"{f}={ports[f]}" for f in HEAD_PORT_FLAGS]
