"""The Dockerfiles name in-image paths literally; each must be one of kit/build/layout.py's.

The probe, the runtime and the VIME command builder read the table; an image laid out otherwise
would make them look in the wrong place, so a path written in a Dockerfile and not in the table
(or the other way round) fails here.
"""

from __future__ import annotations

import re

import pytest

from kit.build import layout as L

from conftest import REPO

DOCKERFILES = ["Dockerfile.cuda", "Dockerfile.rocm", "docker/Dockerfile.cpu"]
_PATH_RE = re.compile(r"/opt/rlk(?:/[A-Za-z0-9_.-]+)*")


def _allowed_paths() -> set[str]:
    dirs = {L.SOURCES_DIR, L.VENV, L.BIN_DIR, L.PYTHON_INSTALL_DIR}
    files = {L.STACK_PATH, L.LOCK_PATH, L.PROBE_AT_BUILD_PATH, L.PYTHON, L.RAY, L.ENTRYPOINT, f"{L.VENV}/bin", f"{L.VENV}/bin/pip"}
    files |= {f"{L.BIN_DIR}/{p.name}" for p in (REPO / "docker" / "bin").iterdir()}
    files |= {L.source_dir(name) for name in ("rl-kernel", "vime", "megatron-lm")}
    return dirs | files


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_in_image_path_of_a_dockerfile_is_in_the_layout(dockerfile):
    text = (REPO / dockerfile).read_text()
    named = {m.group(0).rstrip("/.") for m in _PATH_RE.finditer(text)}
    assert named, f"{dockerfile} names no /opt/rlk path"
    unknown = sorted(named - _allowed_paths())
    assert not unknown, f"{dockerfile} names {unknown}, which kit/build/layout.py does not"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_each_dockerfile_lays_out_what_the_kit_reads(dockerfile):
    text = (REPO / dockerfile).read_text()
    assert f"COPY stack.json {L.STACK_PATH}" in text
    assert f"--check-stack {L.STACK_PATH} --json > {L.PROBE_AT_BUILD_PATH}" in text
    assert f'ENTRYPOINT ["{L.ENTRYPOINT}"]' in text
    assert f"WORKDIR {L.WORKSPACE}" in text
    assert f"COPY docker/bin/ {L.BIN_DIR}/" in text
    assert re.search(rf"{re.escape(L.VENV)}\b", text)
