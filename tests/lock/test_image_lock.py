"""The image equals its lock: the build's last step and the live-container probe name any difference.

Uses the session's CPU smoke image (tests/conftest.py), built from manifests/lock-smoke-cpu.json with
pip --require-hashes --no-deps; edits are made in throwaway images committed from it.
"""

from __future__ import annotations

import json

import pytest

from kit.build.images import verify_image_by_probe
from kit.model.catalog import Catalog

SITE = "/opt/rlk/venv/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def smoke_stack():
    return Catalog.default().stack("smoke")


def _edited(docker_engine, image: str, script: str):
    container = docker_engine.containers.run(image, ["sh", "-c", script], detach=True, entrypoint=[])
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0
        return container.commit(repository="rlk-kit/test-lock-edited", tag="latest")
    finally:
        container.remove(force=True)


def test_the_image_holds_its_lock_and_its_label(cpu_image, docker_engine):
    lock_doc, _ = Catalog.default().lock("smoke", "cpu")
    from kit.model.lock import lock_sha256

    labels = docker_engine.images.get(cpu_image.image_id).labels
    assert labels["dev.rlk-kit.lock.sha256"] == lock_sha256(lock_doc)
    out = docker_engine.containers.run(cpu_image.tag, ["cat", "/opt/rlk/lock.json"], remove=True, entrypoint=[])
    assert json.loads(out) == lock_doc


@pytest.mark.parametrize("script, field", [
    # an extra distribution that the lock does not hold
    (f"mkdir {SITE}/extra_pkg-1.0.dist-info && printf 'Metadata-Version: 2.1\\nName: extra-pkg\\nVersion: 1.0\\n' "
     f"> {SITE}/extra_pkg-1.0.dist-info/METADATA", ("lock.extra-pkg", None, "1.0")),
    # a locked distribution removed
    (f"rm -rf {SITE}/six-*.dist-info {SITE}/six.py", "lock.six"),
])
def test_an_extra_or_missing_distribution_fails_the_live_probe_naming_it(cpu_image, smoke_stack, docker_engine,
                                                                         script, field):
    edited = _edited(docker_engine, cpu_image.tag, script)
    try:
        result = verify_image_by_probe(edited.id, smoke_stack)
        assert not result.matches
        if isinstance(field, tuple):
            assert field in result.differences, result.differences
        else:
            assert any(f == field for f, _, _ in result.differences), result.differences
    finally:
        docker_engine.images.remove(edited.id, force=True)


def test_an_edited_installed_file_fails_the_in_image_lock_check(cpu_image, docker_engine):
    edited = _edited(docker_engine, cpu_image.tag, f"echo '# edited' >> {SITE}/click/__init__.py")
    try:
        proc = docker_engine.containers.run(edited.id, ["kit", "probe", "--no-conformance", "--check-lock",
                                                        "/opt/rlk/lock.json"], detach=True, entrypoint=[])
        try:
            assert proc.wait(timeout=300)["StatusCode"] == 1
            err = proc.logs(stdout=False, stderr=True).decode()
        finally:
            proc.remove(force=True)
        assert "record.click" in err and "click/__init__.py" in err
    finally:
        docker_engine.images.remove(edited.id, force=True)
