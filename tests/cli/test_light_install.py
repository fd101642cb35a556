"""The auditor's install: the built wheel, base dependencies only, in an empty venv.

`kit verify` of the committed GPU pair exits 0 there, `kit compare` and `kit plan` work, none of
torch, Ray, MLflow, docker-py, matplotlib or numpy is installed, and `kit run` / `kit analyze` name
the extra they need in one line (exit 2). benchmarks/light_install.py measures the same install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"torch", "ray", "mlflow", "docker", "matplotlib", "numpy", "pyarrow", "uv"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def light(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("light")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(root / "wheel"), str(REPO)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel = next((root / "wheel").glob("rlk_kit-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "KIT_"))}
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format", "json"], capture_output=True, text=True,
                            env=env, timeout=120)
    site = root / "site"
    site.mkdir()
    (site / "manifests").symlink_to(REPO / "manifests")
    shutil.copytree(REPO / "tests" / "data" / "gpu-pair", site / "RUNS")
    return {"kit": venv / "bin" / "kit", "site": site, "env": env,
            "installed": {d["name"].lower() for d in json.loads(listed.stdout)}}


def kit(light: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(light["kit"]), *args], cwd=light["site"], env=light["env"], capture_output=True,
                          text=True, timeout=300)


def test_the_wheel_installs_no_engine_or_plotting_package(light):
    assert "rlk-kit" in light["installed"]
    assert not HEAVY & light["installed"], sorted(HEAVY & light["installed"])


def test_verify_compare_and_plan_work_without_the_extras(light):
    pair = sorted(f"RUNS/{p.name}" for p in (light["site"] / "RUNS").iterdir())
    proc = kit(light, "verify", *pair)
    assert proc.returncode == 0 and proc.stdout.count("OK   RUNS/") == 2, proc.stdout + proc.stderr
    proc = kit(light, "compare", *pair)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = kit(light, "verify", *sorted(f"manifests/{p.name}" for p in (REPO / "manifests").glob("*.json")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    proc = kit(light, "plan", "--arm", "consistency", "--tp-size", "2", "--cp-size", "4", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["arm"]["name"], proc.stderr


@pytest.mark.parametrize("args, extra", [(("run", "--arm", "smoke", "--allow-dirty"), "run"),
                                         (("analyze", "perf", "--out", "perf", "RUNS"), "analysis"),
                                         (("export", "mlflow", "RUNS"), "export")])
def test_a_command_needing_an_extra_names_it_in_one_line(light, args, extra):
    proc = kit(light, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"pip install 'rlk-kit[{extra}]'" in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr, proc.stderr
