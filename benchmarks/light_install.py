"""The auditor's install: `pip install <built wheel>` into an empty venv, measured.

Builds the kit's wheel from this checkout, installs it (base dependencies only) into a fresh venv,
and records: the time pip took, the size the install added to the venv, the distributions installed
(none of torch, Ray, MLflow, docker-py, matplotlib, numpy may be among them), `kit verify` of the
committed GPU pair (must exit 0) and of the manifests, `kit compare` and `kit plan`, and that
`kit run` / `kit analyze` name their missing extra in one line (exit 2). With --with-run it also
installs `<wheel>[run]` into a second venv and runs `kit run --arm smoke` there (the README's first
command, from a wheel).

    python3 benchmarks/light_install.py                 # writes benchmarks/results/light_install.json
    python3 benchmarks/light_install.py --with-run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ray", "mlflow", "docker", "matplotlib", "numpy", "pyarrow", "uv")


def du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def sh(*cmd, cwd=None, env=None, timeout=900) -> tuple[int, str, str, float]:
    start = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, round(time.monotonic() - start, 2)


def build_wheel(out: Path) -> Path:
    rc, _, err, _ = sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, REPO)
    assert rc == 0, err
    return next(out.glob("rlk_kit-*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--with-run", action="store_true", help="also install [run] and run the smoke arm")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "light_install.json")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="light-install-"))
    result: dict = {"host": {"python": platform.python_version(), "cpus": os.cpu_count(),
                             "load_average": os.getloadavg()[0]}}
    try:
        wheel = build_wheel(scratch / "wheel")
        result["wheel_bytes"] = wheel.stat().st_size
        venv = scratch / "venv"
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        empty = du(venv)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "KIT_"))}
        rc, _, err, seconds = sh(venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel, env=env)
        assert rc == 0, err
        installed = json.loads(sh(venv / "bin" / "pip", "list", "--format", "json", env=env)[1])
        result["install"] = {"seconds": seconds, "added_mb": round((du(venv) - empty) / 1e6, 1),
                             "venv_total_mb": round(du(venv) / 1e6, 1), "empty_venv_mb": round(empty / 1e6, 1),
                             "distributions": sorted(f"{d['name']}=={d['version']}" for d in installed)}
        names = {d["name"].lower() for d in installed}
        result["heavy_installed"] = sorted(n for n in HEAVY if n in names)
        site = scratch / "site"
        site.mkdir()
        (site / "manifests").symlink_to(REPO / "manifests")
        shutil.copytree(REPO / "tests" / "data" / "gpu-pair", site / "RUNS")
        pair = sorted(str(p.relative_to(site)) for p in (site / "RUNS").iterdir())
        kit = venv / "bin" / "kit"
        checks = {"kit verify RUNS/* (committed GPU pair)": [kit, "verify", *pair],
                  "kit verify manifests/*.json": [kit, "verify", *sorted(f"manifests/{p.name}"
                                                                         for p in (REPO / "manifests").glob("*.json"))],
                  "kit compare (the pair)": [kit, "compare", *pair],
                  "kit compare G10 G11": [kit, "compare", "G10", "G11"],
                  "kit plan --arm consistency --tp-size 2 --cp-size 4": [kit, "plan", "--arm", "consistency", "--tp-size", "2",
                                                                         "--cp-size", "4", "--json"],
                  "kit run --arm smoke": [kit, "run", "--arm", "smoke"],
                  "kit analyze perf": [kit, "analyze", "perf", "--out", "perf", pair[0]]}
        result["commands"] = {}
        for label, cmd in checks.items():
            rc, out, err, seconds = sh(*cmd, cwd=site, env=env)
            result["commands"][label] = {"exit": rc, "seconds": seconds,
                                         "stderr_last_line": (err.strip().splitlines() or [""])[-1][:300],
                                         "traceback": "Traceback" in err}
        if args.with_run:
            run_venv = scratch / "venv-run"
            subprocess.run([sys.executable, "-m", "venv", run_venv], check=True)
            rc, _, err, seconds = sh(run_venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check",
                                     f"{wheel}[run]", env=env, timeout=1800)
            assert rc == 0, err[-2000:]
            rc, out, err, run_seconds = sh(run_venv / "bin" / "kit", "run", "--arm", "smoke", "--allow-dirty",
                                           cwd=site, env=env, timeout=1800)
            result["run_extra"] = {"install_seconds": seconds, "venv_total_mb": round(du(run_venv) / 1e6, 1),
                                   "kit_run_smoke_exit": rc, "kit_run_smoke_seconds": run_seconds,
                                   "last_line": (out.strip().splitlines() or [""])[-1][:300],
                                   "stderr_tail": err[-500:] if rc else ""}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
