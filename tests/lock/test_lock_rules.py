"""The lock rules over the committed locks, a cu13 edit, the unfixed TE 2.18 case and a ROCm fixture."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.model.documents import schema_problems

from kit.evidence.verify import verify_document_file
from kit.model.catalog import Catalog
from kit.model.lock import cuda_major, install_files, lock_differences, lock_rule_problems, lock_sha256

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
ROCM_FIXTURE = Path(__file__).parent / "data" / "lock-rocm-fixture.json"
CUDA_LOCKS = ["vime-base", "vime-g10", "vime-g11", "vime-current"]


def _lock(name: str, platform: str = "cuda") -> dict:
    return json.loads((MANIFESTS / f"lock-{name}-{platform}.json").read_text())


@pytest.mark.parametrize("stack", CUDA_LOCKS)
def test_committed_cuda_locks_are_complete_and_pass_the_rules(stack):
    lock = _lock(stack)
    versions = {p["name"]: p["version"] for p in lock["packages"]}
    assert len(lock["packages"]) >= 150
    assert versions["torch"] == "2.9.1" and versions["vllm"] == "0.16.0"
    assert all(f["sha256"] and len(f["sha256"]) == 64 for p in lock["packages"] for f in p["files"])
    assert not any("://" in json.dumps(p) for p in lock["packages"]), "a lock names no index host"
    assert verify_document_file(MANIFESTS / f"lock-{stack}-cuda.json").status == "ok"


def test_g10_locks_the_cuda12_core_of_te_2_18():
    versions = {p["name"]: p["version"] for p in _lock("vime-g10")["packages"]}
    assert versions["transformer-engine-cu12"] == "2.18.0" and "transformer-engine-cu13" not in versions


def test_a_cu13_package_in_a_cu12_lock_fails_verify_naming_package_and_rule(tmp_path):
    for path in MANIFESTS.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    lock = _lock("vime-g11")
    i = next(i for i, p in enumerate(lock["packages"]) if p["name"] == "nvidia-nccl-cu12")
    lock["packages"][i]["name"] = "nvidia-nccl-cu13"
    target = tmp_path / "lock-vime-g11-cuda.json"
    target.write_text(json.dumps(lock))
    proc = subprocess.run([sys.executable, "-m", "kit", "verify", str(target)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "nvidia-nccl-cu13" in proc.stdout and "cuda-major" in proc.stdout


def test_the_unfixed_te_2_18_resolution_is_caught():
    """transformer-engine[pytorch]==2.18.0 as written resolves to the CUDA 13 core next to torch cu12.8."""
    lock = _lock("vime-g10")
    unfixed = copy.deepcopy(lock)
    for p in unfixed["packages"]:
        if p["name"] == "transformer-engine-cu12":
            p["name"] = "transformer-engine-cu13"
    problems = lock_rule_problems(unfixed)
    assert any("transformer-engine-cu13" in m and m.startswith("cuda-major") for _, m in problems)


def test_rules_place_every_kind_of_cuda_package():
    assert cuda_major("cupy-cuda12x", "14.2.0")[0] == 12
    assert cuda_major("cuda-bindings", "13.5.0")[0] == 13
    assert cuda_major("flashinfer-jit-cache", "0.6.3+cu129")[0] == 12
    assert cuda_major("torch", "2.9.1+cu130")[0] == 13
    assert cuda_major("nvidia-cutlass-dsl-libs-cu13", "4.8.1")[0] == 13
    assert cuda_major("nvidia-ml-py", "13.615.71") == (None, "")


def test_unknown_cuda_release_fails_closed():
    lock = _lock("vime-g11")
    del lock["target"]["accelerator"]["version"]
    assert any(m.startswith("cuda-version") for _, m in lock_rule_problems(lock))


def test_rocm_fixture_passes_and_cuda_packages_or_wrong_torch_fail():
    lock = json.loads(ROCM_FIXTURE.read_text())
    assert lock_rule_problems(lock) == []
    bad = copy.deepcopy(lock)
    bad["packages"].append({"name": "nvidia-nccl-cu12", "version": "2.27.5",
                            "files": [{"file": "nvidia_nccl_cu12-2.27.5-py3-none-manylinux_2_18_x86_64.whl", "sha256": "3" * 64}]})
    bad["packages"][2]["version"] = "2.9.1+rocm6.2"
    messages = [m for _, m in lock_rule_problems(bad)]
    assert any(m.startswith("no-cuda-in-rocm: nvidia-nccl-cu12") for m in messages)
    assert any(m.startswith("torch-local-version: torch 2.9.1+rocm6.2") for m in messages)
    cuda = copy.deepcopy(_lock("vime-g11"))
    cuda["packages"].append(lock["packages"][1])
    assert any(m.startswith("no-rocm-in-cuda: pytorch-triton-rocm") for _, m in lock_rule_problems(cuda))


def test_a_lock_that_no_longer_matches_its_stack_is_stale():
    catalog = Catalog.load(MANIFESTS)
    stack = copy.deepcopy(catalog.stack("vime-g11").document)
    stack["packages"]["vllm"] = "0.16.1"
    messages = [m for _, m in lock_rule_problems(_lock("vime-g11"), stack)]
    assert any(m.startswith("stale:") and "vllm[" not in m and "vllm==0.16.1" in m for m in messages)


def test_drift_and_identity():
    a = _lock("vime-g11")
    b = copy.deepcopy(a)
    b["packages"] = [p for p in b["packages"] if p["name"] != "zipp"]
    b["packages"][0]["files"][0]["sha256"] = "f" * 64
    drift = lock_differences(a, b)
    assert drift["removed"] == [f"zipp {next(p['version'] for p in a['packages'] if p['name'] == 'zipp')}"]
    assert drift["changed"] and not drift["added"]
    assert lock_sha256(a) != lock_sha256(b)
    c = copy.deepcopy(a)
    c["resolver"]["version"] = "9.9.9"
    assert lock_sha256(a) == lock_sha256(c), "the resolver's version is not part of what an image installs"


def test_one_changed_hash_changes_the_image_tag(tmp_path):
    def tag(manifests: Path) -> str:
        proc = subprocess.run([sys.executable, "-m", "kit", "build", "cuda", "--arm", "G11", "--dry-run", "--json",
                               "--workspace", str(tmp_path / "ws")], capture_output=True, text=True,
                              env={**__import__("os").environ, "KIT_MANIFESTS": str(manifests)}, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["tag"]

    copy_dir = tmp_path / "manifests"
    copy_dir.mkdir()
    for path in MANIFESTS.rglob("*"):
        if path.is_file():
            (copy_dir / path.relative_to(MANIFESTS)).parent.mkdir(parents=True, exist_ok=True)
            (copy_dir / path.relative_to(MANIFESTS)).write_bytes(path.read_bytes())
    before = tag(copy_dir)
    lock = _lock("vime-g11")
    lock["packages"][0]["files"][0]["sha256"] = "0" * 64
    (copy_dir / "lock-vime-g11-cuda.json").write_text(json.dumps(lock))
    assert tag(copy_dir) != before


def test_a_platform_variant_with_its_own_python_is_a_data_change():
    from kit.model.lock import target_of
    from kit.model.stack import stack_rule_problems

    stack = copy.deepcopy(Catalog.load(MANIFESTS).stack("vime-g11").document)
    stack["platforms"]["cuda-debian"] = {"base_image": "rlk-kit/debian-base:bookworm", "unresolved": True,
                                         "python": "3.11.2", "cuda_version": "12.8", "cuda_arch_list": ["9.0"]}
    assert stack_rule_problems(stack) == []
    assert target_of(stack, "cuda-debian") == {"python": "3.11.2", "python_platform": "x86_64-manylinux_2_28",
                                               "accelerator": {"kind": "cuda", "version": "12.8"}}
    del stack["platforms"]["cuda-debian"]["cuda_arch_list"]
    assert any("cuda_arch_list" in m for _, m in stack_rule_problems(stack))


def test_rocm_lock_names_the_unreachable_index_and_what_to_run():
    from kit.build.resolve import Unreachable, resolve_lock

    stack = Catalog.load(MANIFESTS).stack("vime-g11").document
    with pytest.raises(Unreachable) as err:
        resolve_lock(stack, "rocm", index="http://127.0.0.1:9/rocm6.3")
    message = str(err.value)
    assert "http://127.0.0.1:9/rocm6.3" in message and "not reachable" in message
    assert "kit lock vime-g11 --platform rocm --index http://127.0.0.1:9/rocm6.3" in message


def test_kit_lock_check_without_an_index_exits_2(tmp_path):
    env = {**__import__("os").environ, "KIT_MANIFESTS": str(MANIFESTS)}
    proc = subprocess.run([sys.executable, "-m", "kit", "lock", "vime-g11", "--check", "--index",
                           "http://127.0.0.1:9/simple"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "UNREACHABLE" in proc.stdout and "not reachable" in proc.stdout


def test_kit_lock_check_of_every_committed_lock_without_network_exits_2(tmp_path):
    """The network really cut: the index is a closed local port and no local wheel directory is given."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("UV_")}
    env.update(KIT_MANIFESTS=str(MANIFESTS), PIP_FIND_LINKS="", UV_HTTP_RETRIES="0")   # refused at once, not retried
    proc = subprocess.run([sys.executable, "-m", "kit", "lock", "--check", "--json", "--index",
                           "http://127.0.0.1:9/simple"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert {(r["stack"], r["platform"]) for r in results} == set(Catalog.load(MANIFESTS).lock_docs)
    assert len(results) == len(list(MANIFESTS.glob("lock-*.json")))
    assert all(r["status"] == "unreachable" and "not reachable" in r["message"] for r in results), results


@pytest.mark.slow
def test_kit_lock_check_of_the_smoke_lock_with_the_index_separates_drift_from_a_broken_lock(tmp_path):
    """With PyPI (and this host's wheel directory for torch +cpu): the committed lock still installs (exit 0,
    whatever newer releases a resolver would now pick, listed as drift); --strict fails on drift; a lock
    with one sha256 altered no longer installs (exit 1, the package named)."""
    import shutil

    env = {**__import__("os").environ, "KIT_MANIFESTS": str(MANIFESTS)}
    proc = subprocess.run([sys.executable, "-m", "kit", "lock", "smoke", "--check", "--json"], capture_output=True,
                          text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert not schema_problems(doc, expected="lock-report")
    [result] = doc["results"]
    assert result["status"] in ("ok", "drift") and result["not_served"] == [], result
    strict = subprocess.run([sys.executable, "-m", "kit", "lock", "smoke", "--check", "--strict"],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert strict.returncode == (1 if result["status"] == "drift" else 0), strict.stdout
    # one locked hash altered: the lock no longer installs, whether or not anything drifted
    altered = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, altered)
    lock = json.loads((altered / "lock-smoke-cpu.json").read_text())
    victim = next(p for p in lock["packages"] if p["name"] == "click")
    victim["files"][0]["sha256"] = "0" * 64
    (altered / "lock-smoke-cpu.json").write_text(json.dumps(lock, indent=2))
    proc = subprocess.run([sys.executable, "-m", "kit", "lock", "smoke", "--check"], capture_output=True,
                          text=True, env={**env, "KIT_MANIFESTS": str(altered)}, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "BROKEN" in proc.stdout and f"click {victim['version']}" in proc.stdout and "sha256 changed" in proc.stdout


def test_a_check_tells_a_lock_that_no_longer_installs_from_newer_releases():
    from kit.model.lock import built_locally, index_drift, local_wheel_problems, pinned_requirements, served_problems

    def pkg(name, version, *files):
        return {"name": name, "version": version, "files": [{"file": f, "sha256": h} for f, h in files]}

    te = pkg("transformer-engine-torch", "2.11.0", ("transformer_engine_torch-2.11.0-cp311-cp311-linux_x86_64.whl", "c" * 64))
    committed = {"packages": [pkg("a", "1", ("a-1-py3-none-any.whl", "a" * 64)),
                              pkg("b", "2", ("b-2-py3-none-manylinux_2_28_x86_64.whl", "b" * 64)), te]}
    assert built_locally(te) and not built_locally(committed["packages"][1])
    assert pinned_requirements(committed) == ["a==1", "b==2"]
    # a newer release of a, and the index's sdist for the locally built wheel: drift, not breakage
    fresh = {"packages": [pkg("a", "1.1", ("a-1.1-py3-none-any.whl", "d" * 64)), committed["packages"][1],
                          pkg("transformer-engine-torch", "2.11.0", ("transformer_engine_torch-2.11.0.tar.gz", "e" * 64))]}
    assert index_drift(committed, fresh) == {"added": [], "removed": [], "changed": ["a 1 -> 1.1"]}
    assert served_problems(committed, committed) == []
    served = {"packages": [pkg("a", "1", ("a-1-py3-none-any.whl", "f" * 64))]}
    assert served_problems(committed, served) == [
        f"a 1: a-1-py3-none-any.whl sha256 changed: locked {'a' * 64}, served {'f' * 64}", "b 2: no longer served"]
    wheel = te["files"][0]["file"]
    assert local_wheel_problems(committed, {wheel: "c" * 64}) == ([], [])
    problems, notes = local_wheel_problems(committed, {wheel: "9" * 64})
    assert len(problems) == 1 and "transformer-engine-torch 2.11.0" in problems[0] and not notes
    problems, notes = local_wheel_problems(committed, {})
    assert not problems and "--find-links" in notes[0]


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cuda", "Dockerfile.rocm"])
def test_cuda_and_rocm_images_install_their_lock_only_and_compare_it(dockerfile):
    code = "\n".join(line for line in (REPO / dockerfile).read_text().splitlines() if not line.lstrip().startswith("#"))
    assert "PACKAGES" not in code and "UV_VERSION" not in code and "TRANSFORMER_ENGINE_VERSION" not in code
    # every Python package install is by sha256 without deps (or the kit / a baked source, without deps)
    python_installs = [line for line in code.splitlines() if "pip install" in line or "pip sync" in line]
    assert python_installs and all("--require-hashes" in line or "--no-deps" in line or "kit-src" in line
                                   or "-e ." in line for line in python_installs), python_installs
    assert "uv pip sync" in code and "--no-build " in code and "/tmp/rlk-lock/requirements.lock" in code
    assert "-r /tmp/rlk-lock/bootstrap.lock" in code and "-r /tmp/rlk-lock/requirements-sdist.lock" in code
    assert "COPY lock/ /tmp/rlk-lock/" in code and "COPY lock.json /opt/rlk/lock.json" in code
    assert "kit probe --check-lock /opt/rlk/lock.json" in code


def test_the_g11_plan_renders_its_lock_into_the_context(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kit", "build", "cuda", "--arm", "G11", "--dry-run", "--json",
                           "--workspace", str(tmp_path / "ws")], capture_output=True, text=True,
                          env={**__import__("os").environ, "KIT_MANIFESTS": str(MANIFESTS)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    lock = _lock("vime-g11")
    files = install_files(lock)
    listed = {e["path"]: e["digest"] for e in plan["context"]}
    for name, text in files.items():
        assert listed[f"lock/{name}"] == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert files["bootstrap.lock"].startswith("uv==") and "transformer-engine-torch==2.11.0" in files["requirements-sdist.lock"]
    assert len(files["requirements.lock"].splitlines()) + 1 == len(lock["packages"]) >= 150
    assert "vllm==0.16.0 --hash=sha256:" in files["requirements.lock"]   # its manylinux_2_31 wheel, not the sdist
    assert plan["labels"]["dev.rlk-kit.lock.sha256"] == lock_sha256(lock)


def test_the_gpu_h200_revision_is_locked_for_cuda_13_and_the_sealed_pair_keeps_revision_1():
    catalog = Catalog.load(MANIFESTS)
    lock, _ = catalog.lock("gpu-h200-r2", "cuda")
    stack = catalog.stack("gpu-h200-r2").document
    assert lock_rule_problems(lock, stack) == []
    versions = {p["name"]: p["version"] for p in lock["packages"]}
    assert versions["torch"] == "2.11.0" and versions["triton"] == "3.6.0" and versions["cuda-toolkit"].startswith("13.")
    assert all(len(f["sha256"]) == 64 for p in lock["packages"] for f in p["files"])
    # a CUDA 12 library in it is named by the rule
    bad = copy.deepcopy(lock)
    bad["packages"].append({"name": "nvidia-nccl-cu12", "version": "2.27.5", "files": [{"file": "x.whl", "sha256": "0" * 64}]})
    assert any("cuda-major: nvidia-nccl-cu12" in m for _, m in lock_rule_problems(bad))
    assert cuda_major("cuda-toolkit", "12.8.1")[0] == 12
    # The committed H200 pair is tied to revision 1 (no lock), whose sha256 has not moved.
    pair = sorted((REPO / "tests" / "data" / "gpu-pair").glob("*/manifest.json"))
    assert len(pair) == 2
    for path in pair:
        assert json.loads(path.read_text())["stack"]["sha256"] == catalog.stack("gpu-h200").sha256
