"""`kit build cuda-debian` on the real engine, with CI's small CUDA-shaped stack (manifests/stack-ci-cuda-debian.json).

The same code paths as the multi-GB VIME image (docs/cuda-image.md): the lock's wheels found,
checked by sha256 and served to the build over the engine's bridge (never sent as context), one
layer per rebuild-cost group, a source baked from a `git archive` tarball proven by commit and
tree, the kit, the in-image comparison of installed distributions with the lock, `kit verify
--image`. Refusals: an edited locked hash, an edited byte of a wheel, an archive of another commit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, run_kit
from kit.build import smoke_sources
from kit.build.wheelhouse import LAYERS

STACK = "ci-cuda-debian"
PIN = "48b7992848b1bac70ad08e48af57f6bcc26bdaac"   # the fixture plus its extra_commit() (manifests/stack-ci-cuda-debian.json)


def archive(repo: Path, commit: str, out: Path) -> Path:
    subprocess.run(["git", "-C", str(repo), "archive", "--format=tar.gz", "--prefix=megatron-lm/", "-o", str(out),
                    commit], check=True)
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A source cache holding the fixture Megatron-LM as a `git archive` tarball at the pin, and a
    repository with one more commit for the refusal test."""
    root = tmp_path_factory.mktemp("cuda-sources")
    repo = smoke_sources.materialize("megatron-lm", root / "repo")
    assert smoke_sources.extra_commit(repo) == PIN
    cache = root / "cache"
    cache.mkdir()
    archive(repo, PIN, cache / f"megatron-lm-{PIN[:8]}.tar.gz")
    return {"cache": cache, "repo": repo}


@pytest.fixture(scope="module")
def ci_image(docker_engine, sources, tmp_path_factory):
    workspace = tmp_path_factory.mktemp("cuda-ws")
    args = ["build", "cuda-debian", "--stack", STACK, "--sources", str(sources["cache"]), "--workspace", str(workspace)]
    # --no-cache: a tag left by an earlier session is not reused, every layer is made here.
    proc = run_kit(*args, "--json", "--no-cache")
    assert proc.returncode == 0, f"kit build failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    record = json.loads(proc.stdout)
    yield {"record": record, "workspace": workspace, "args": args, "stderr": proc.stderr}
    for tag in (record["tag"],):
        try:
            docker_engine.images.remove(tag, noprune=False)
        except Exception:   # already removed by a test
            pass


def test_image_holds_the_lock_layer_by_layer(ci_image, docker_engine):
    record = ci_image["record"]
    labels = docker_engine.images.get(record["tag"]).labels
    assert labels["dev.rlk-kit.platform"] == "cuda-debian"
    assert labels["dev.rlk-kit.stack.name"] == STACK
    assert labels["dev.rlk-kit.source.megatron-lm.tree"] == "fa119313cb66eb61c67f119c5d4e83245a8a3485"
    lock = json.loads((REPO / "manifests" / "lock-ci-cuda-debian-cuda-debian.json").read_text())
    assert labels["dev.rlk-kit.lock.sha256"]
    # The wheels were served, not sent: the context is the small files only.
    assert record["context"]["bytes"] < 5_000_000
    # Every locked file checked and served once (the fixture builds without the engine's cache).
    total = sum(f["size"] for p in lock["packages"] for f in p["files"][:1])
    assert record["wheelhouse"] == {"files": len(lock["packages"]), "served": len(lock["packages"]),
                                    "served_bytes": total}
    # Each layer group is its own requirements file in the image, hash-pinned.
    run = docker_engine.containers.run(record["tag"], ["sh", "-c", "cat /opt/rlk/layers/*.txt; pip list --format=json"],
                                       entrypoint=["/opt/rlk/bin/entrypoint"], network_mode="none", remove=True)
    text = run.decode()
    for pkg in lock["packages"]:
        assert f"{pkg['name']}=={pkg['version']} --hash=sha256:" in text
    installed = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(text.splitlines()[-1])}
    assert installed["nvidia-cuda-runtime"] == "13.0.96" and installed["pip"] == "25.2"
    assert len(LAYERS) == 4


def test_verify_image_checks_labels_lock_imports(ci_image):
    proc = run_kit("verify", "--image", ci_image["record"]["tag"], "--stack", STACK, "--json",
                   env={"KIT_WORKSPACE": str(ci_image["workspace"])})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    text = json.dumps(doc)
    assert "megatron.core" in text and "not checked without a GPU" in text


def test_same_build_again_reuses_the_tag_fast(ci_image):
    t0 = time.monotonic()
    proc = run_kit(*ci_image["args"], "--json")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)
    assert record["tag"] == ci_image["record"]["tag"] and record["cached"] is True
    assert record["image_id"] == ci_image["record"]["image_id"]
    assert elapsed < 10, elapsed   # wheel hashes and the archive check are remembered


def test_one_byte_of_a_wheel_fails_naming_the_file(ci_image, tmp_path):
    own = next((ci_image["workspace"] / "wheelhouse").iterdir())
    wheelhouse = tmp_path / "wh"
    shutil.copytree(own, wheelhouse)
    victim = next(wheelhouse.glob("click-*.whl"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    proc = run_kit(*ci_image["args"], "--wheelhouse", str(wheelhouse), "--no-cache")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert victim.name in proc.stderr and "sha256" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "[1/" not in proc.stderr   # stopped before the engine's first step


def test_one_locked_hash_edited_fails_naming_the_file(ci_image, tmp_path):
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    path = manifests / "lock-ci-cuda-debian-cuda-debian.json"
    lock = json.loads(path.read_text())
    pkg = next(p for p in lock["packages"] if p["name"] == "nvidia-cuda-runtime")
    pkg["files"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(lock, indent=2))
    proc = run_kit(*ci_image["args"], env={"KIT_MANIFESTS": str(manifests)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert pkg["files"][0]["file"] in proc.stderr and "0" * 64 in proc.stderr


def test_archive_of_another_commit_is_refused_before_any_layer(ci_image, sources, tmp_path):
    other = smoke_sources.FIXTURE_COMMITS["megatron-lm"]   # the parent of the pin
    cache = tmp_path / "cache"
    cache.mkdir()
    archive(sources["repo"], other, cache / f"megatron-lm-{PIN[:8]}.tar.gz")   # the right name, another commit
    args = [a if a != str(sources["cache"]) else str(cache) for a in ci_image["args"]]
    t0 = time.monotonic()
    proc = run_kit(*args)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"holds commit {other}" in proc.stderr and "tree" in proc.stderr
    assert "[1/" not in proc.stderr and time.monotonic() - t0 < 60   # no engine step ran
