"""The cuda-debian platform without an engine: layer groups, wheel checks, the wheel server, the plan."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, run_kit
from kit.build.wheel_server import index_page, serve_wheels
from kit.build.wheelhouse import LAYERS, StatCache, layer_groups, layer_of, locate_wheels
from kit.model.errors import CheckFailed
from kit.model.lock import lock_rule_problems


def real_lock() -> dict:
    return json.loads((REPO / "manifests" / "lock-vime-base-debian-cuda-debian.json").read_text())


def test_layers_follow_rebuild_cost():
    assert [layer_of(n) for n in ("nvidia-cudnn-cu12", "cuda-bindings", "pip", "torch", "triton", "vllm", "ray",
                                  "transformer-engine-torch", "transformer-engine-cu12")] == \
        ["1-cuda", "1-cuda", "1-cuda", "2-torch", "2-torch", "3-packages", "3-packages", "4-te", "4-te"]
    groups = layer_groups(real_lock())
    assert [g.name for g in groups] == list(LAYERS)
    names = {g.name: {p["name"] for p in g.packages} for g in groups}
    assert {"torch", "triton"} <= names["2-torch"] and "vllm" in names["3-packages"]
    assert names["4-te"] == {"transformer-engine", "transformer-engine-cu12", "transformer-engine-torch"}
    assert sum(len(g.packages) for g in groups) == len(real_lock()["packages"])
    line = next(x for x in groups[3].requirements().splitlines() if x.startswith("transformer-engine-torch"))
    # The compiled extension is a locked local wheel, pinned by its sha256 (docs/cuda-image.md).
    assert line == ("transformer-engine-torch==2.11.0 "
                    "--hash=sha256:41f4e3f8f65e74b2b694b8bb2a7dcc19feca2b75e363f966dc4e13c6d75c7e82")


def test_real_lock_keeps_the_rules():
    from kit.model.catalog import Catalog

    stack = Catalog.default().stack("vime-base-debian").document
    assert lock_rule_problems(real_lock(), stack) == []
    assert real_lock()["target"]["python"] == "3.11.2"


def lock_of(tmp_path: Path, contents: dict[str, bytes]) -> dict:
    return {"target": {"python": "3.11.2", "python_platform": "x86_64-manylinux_2_36"},
            "packages": [{"name": name.split("-")[0], "version": "1.0",
                          "files": [{"file": name, "sha256": hashlib.sha256(data).hexdigest()}]}
                         for name, data in contents.items()]}


def test_wheels_are_checked_and_an_edited_byte_is_named(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    contents = {"a-1.0-py3-none-any.whl": b"alpha" * 100, "b-1.0-py3-none-any.whl": b"beta" * 100}
    for name, data in contents.items():
        (house / name).write_bytes(data)
    lock = lock_of(tmp_path, contents)
    found = locate_wheels(lock, [house], workspace=tmp_path / "ws", download=False)
    assert found == {n: house / n for n in contents}
    cache = json.loads((tmp_path / "ws" / "cache" / "wheel-hashes.json").read_text())
    assert cache["schema"] == "rlk-kit/hash-cache/v1" and len(cache["entries"]) == 2
    (house / "b-1.0-py3-none-any.whl").write_bytes(b"beta" * 99 + b"betA")
    with pytest.raises(CheckFailed, match="b-1.0-py3-none-any.whl: sha256 .* is not the"):
        locate_wheels(lock, [house], workspace=tmp_path / "ws", download=False)


def test_stat_cache_rehashes_a_changed_file(tmp_path):
    f = tmp_path / "x.whl"
    f.write_bytes(b"one")
    cache = StatCache(tmp_path / "c.json")
    assert cache.sha256(f) == hashlib.sha256(b"one").hexdigest()
    f.write_bytes(b"two!")
    assert cache.sha256(f) == hashlib.sha256(b"two!").hexdigest()


def test_server_serves_only_locked_files_as_a_proxy(tmp_path):
    wheel = tmp_path / "a-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel bytes")
    (tmp_path / "secret.txt").write_text("not served")
    seen = []
    with serve_wheels({wheel.name: wheel}, host="127.0.0.1", progress=seen.append) as proxy:
        assert proxy.startswith("http://127.0.0.1:")
        # The build reaches it as its http_proxy: the request names the whole URL, the host needs no DNS.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
        assert wheel.name.encode() in opener.open("http://rlk-wheelhouse/").read()
        assert opener.open(f"http://rlk-wheelhouse/{wheel.name}").read() == b"wheel bytes"
        assert urllib.request.urlopen(f"{proxy}/{wheel.name}").read() == b"wheel bytes"
        with pytest.raises(urllib.error.HTTPError):
            opener.open("http://rlk-wheelhouse/secret.txt")
    assert seen and "wheel 1/2" not in seen[0] and "wheel 1/1" in seen[0]
    assert index_page(["b", "a"]).index(b"a") < index_page(["b", "a"]).index(b">b<")


def test_dry_run_plans_the_debian_cuda_image():
    proc = run_kit("build", "cuda-debian", "--stack", "vime-base-debian", "--dry-run", "--json",
                   "--sources", "/nonexistent-dir-for-test")
    assert proc.returncode == 2 and "--sources /nonexistent-dir-for-test: no such directory" in proc.stderr
    proc = run_kit("build", "cuda-debian", "--stack", "ci-cuda-debian", "--dry-run", "--json", "--sources", str(REPO))
    # The repository holds no megatron-lm archive: the build stops naming the source and the pin.
    assert proc.returncode == 1 and "source megatron-lm" in proc.stderr and "Traceback" not in proc.stderr
