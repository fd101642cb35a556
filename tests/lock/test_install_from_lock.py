"""A small real lock: uv resolves it, pip installs exactly its files by sha256, the comparison judges it.

Real wheels from the package index, real uv, real pip, a real venv. The comparison runs inside the
venv's own interpreter (the kit is put on its sys.path), as it does inside an image.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from kit.build.installed import installed_differences
from kit.build.resolve import default_find_links, resolve_lock, uv_command
from kit.model.lock import hashed_requirements, install_files, lock_rule_problems

REPO = Path(__file__).resolve().parents[2]
STACK = {"schema": "rlk-kit/stack/v2", "name": "tiny", "python": f"{sys.version_info.major}.{sys.version_info.minor}",
         "platforms": {"cpu": {"base_image": "rlk-kit/debian-base:bookworm", "unresolved": True}},
         "packages": {"six": "1.17.0", "python-dateutil": "2.9.0.post0"}, "sources": []}
COMPARE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from kit.build.installed import installed_differences, installed_versions, record_differences
lock = json.load(open(sys.argv[2]))
print(json.dumps(installed_differences(lock, installed_versions()) + record_differences()))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    lock = resolve_lock(STACK, "cpu", find_links=default_find_links())
    (root / "lock.json").write_text(json.dumps(lock))
    (root / "requirements.lock").write_text(hashed_requirements(lock))
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    # pip and setuptools are the venv's seeds, not the lock's: uninstall them so the env is the lock.
    subprocess.run([py, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "--dest", root / "wh",
                    "-r", root / "requirements.lock"], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", root / "wh", "--require-hashes",
                    "--no-deps", "-r", root / "requirements.lock"], check=True)
    subprocess.run([py, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=False)
    return root, lock, py


def _compare(root: Path, py: Path) -> list:
    proc = subprocess.run([py, "-c", COMPARE, str(REPO), str(root / "lock.json")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [d for d in json.loads(proc.stdout) if not d[0].endswith((".pip", ".setuptools"))]


def test_the_tiny_lock_is_real_and_passes_the_rules(tiny):
    _, lock, _ = tiny
    assert {p["name"] for p in lock["packages"]} == {"six", "python-dateutil"}
    assert all(len(f["sha256"]) == 64 for p in lock["packages"] for f in p["files"])
    assert lock_rule_problems(lock, STACK) == []


def test_pip_refuses_a_file_whose_hash_is_not_locked(tiny, tmp_path):
    root, lock, py = tiny
    bad = json.loads(json.dumps(lock))
    bad["packages"][0]["files"][0]["sha256"] = "0" * 64
    req = tmp_path / "bad.lock"
    req.write_text(hashed_requirements(bad))
    proc = subprocess.run([py, "-m", "pip", "install", "--no-index", "--find-links", root / "wh", "--require-hashes",
                           "--no-deps", "--force-reinstall", "-r", req], capture_output=True, text=True)
    assert proc.returncode != 0 and "HASHES" in proc.stderr.upper()


def test_installed_equals_lock_then_extra_missing_and_edited_are_named(tiny):
    root, lock, py = tiny
    assert _compare(root, py) == []
    # an edited installed file: its RECORD hash no longer holds
    site = Path(subprocess.run([py, "-c", "import six; print(six.__file__)"], capture_output=True, text=True,
                               check=True).stdout.strip())
    original = site.read_bytes()
    site.write_bytes(original + b"\n# edited\n")
    try:
        found = _compare(root, py)
        assert any(f == "record.six" and "six.py" in (e or "") for f, e, o in found)
    finally:
        site.write_bytes(original)
    # a missing distribution
    subprocess.run([py, "-m", "pip", "uninstall", "-q", "-y", "six"], check=True)
    try:
        assert ["lock.six", "1.17.0", None] in _compare(root, py)
    finally:
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", root / "wh", "--no-deps",
                        "six==1.17.0"], check=True)
    assert _compare(root, py) == []


def test_the_image_install_lines_install_exactly_the_rendered_lock(tiny, tmp_path):
    """Dockerfile.cuda/.rocm's step, for real: `uv pip sync --require-hashes --no-build` of the
    requirements.lock that kit build renders, then the installed-vs-lock comparison."""
    root, lock, _ = tiny
    files = install_files(lock)
    assert files["requirements-sdist.lock"] == "" and files["bootstrap.lock"] == ""   # all wheels, no uv here
    (tmp_path / "requirements.lock").write_text(files["requirements.lock"])
    uv = uv_command()
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, tmp_path / "venv"], check=True)
    py = tmp_path / "venv" / "bin" / "python"
    sync = [*uv, "pip", "sync", "-q", "--python", py, "--no-index", "--find-links", root / "wh", "--require-hashes",
            "--no-build"]
    subprocess.run([*sync, tmp_path / "requirements.lock"], check=True)
    (tmp_path / "lock.json").write_text(json.dumps(lock))
    assert _compare(tmp_path, py) == []
    # One changed sha256 in the rendered file: uv installs nothing from it.
    bad = files["requirements.lock"].replace(lock["packages"][0]["files"][0]["sha256"], "0" * 64)
    (tmp_path / "bad.lock").write_text(bad)
    subprocess.run([*uv, "pip", "uninstall", "-q", "--python", py, lock["packages"][0]["name"]], check=True)
    proc = subprocess.run([*sync, tmp_path / "bad.lock"], capture_output=True, text=True)
    assert proc.returncode != 0 and "hash" in proc.stderr.lower(), proc.stderr
    assert [f"lock.{lock['packages'][0]['name']}", lock["packages"][0]["version"], None] in _compare(tmp_path, py)


def test_distributions_of_baked_sources_are_apart_from_the_lock_but_lock_entries_are_not():
    lock = {"packages": [{"name": "six", "version": "1.17.0", "files": []}]}
    installed = {"six": "1.17.0", "rl-kernel": "0.1.0", "rlk-kit": "0.1.0"}
    assert installed_differences(lock, installed) == [("lock.rl-kernel", None, "0.1.0")]
    assert installed_differences(lock, installed, {"rl-kernel"}) == []
    # a locked name stays judged by the lock even when a source installed it
    assert installed_differences(lock, {"six": "9"}, {"six"}) == [("lock.six", "1.17.0", "9")]
