"""`kit build cpu --arm smoke` on the real engine: labels, in-container probe, cache, refusals, tampering."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess

import pytest

from kit.build import smoke_sources
from kit.model.catalog import Catalog
from kit.model.errors import BadInput
from kit.build.images import base_image_id, check_image, verify_image_by_probe

from conftest import REPO, run_kit


@pytest.fixture(scope="module")
def smoke_stack():
    return Catalog.default().stack("smoke")


def test_labels_hold_the_pins(cpu_image, smoke_stack, docker_engine):
    labels = docker_engine.images.get(cpu_image.image_id).labels
    for src in smoke_stack.sources:
        assert labels[f"dev.rlk-kit.source.{src['name']}.commit"] == src["commit"] == smoke_sources.FIXTURE_COMMITS[src["name"]]
    assert labels["dev.rlk-kit.package.torch"] == "2.13.0+cpu"
    assert labels["dev.rlk-kit.package.ray"] == "2.60.0"
    assert labels["dev.rlk-kit.python"] == "3.11.2"
    assert labels["dev.rlk-kit.stack.sha256"] == smoke_stack.sha256
    assert labels["dev.rlk-kit.inputs.sha256"] == cpu_image.record["inputs_sha256"]
    assert cpu_image.tag.endswith(cpu_image.record["inputs_sha256"][:12])
    assert labels["org.opencontainers.image.created"] == "2026-01-01T00:00:00Z"   # the fixtures' commit date
    # The locally made base has no digest: its local id stands in (docker/make-base-image.sh).
    assert labels["dev.rlk-kit.base.unresolved"] == "true"
    assert labels["dev.rlk-kit.base.id"] == cpu_image.record["base_image"]["id"] == docker_engine.images.get(
        "rlk-kit/debian-base:bookworm").id
    # Which checkout built it is not an input: it is in the build record, not in the image.
    assert "org.opencontainers.image.revision" not in labels and "org.opencontainers.image.source" not in labels
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", cpu_image.record["checkout"]["revision"])
    assert re.fullmatch(r"[0-9a-f]{64}", labels["dev.rlk-kit.kit.source-sha256"])
    check = check_image(cpu_image.tag, smoke_stack)
    assert check.matches, check.differences


def test_build_record_is_written_and_valid(cpu_image, kit_workspace):
    from kit.model.documents import read_json_file, schema_problems

    records = sorted((kit_workspace / "builds").glob(cpu_image.tag.replace("/", "_").replace(":", "_") + "-*.json"))
    assert records
    doc = read_json_file(records[-1])
    assert schema_problems(doc) == []
    assert doc["image_id"] == cpu_image.image_id
    assert doc["engine"]["version"]
    assert {s["name"] for s in doc["sources"]} == {"rl-kernel", "vime", "megatron-lm"}
    # The fingerprint the in-image probe computed at build time (torch CPU and rlk_kernels are in the image).
    assert re.fullmatch(r"[0-9a-f]{64}", doc["conformance_fingerprint"]), doc["conformance_fingerprint"]


def test_probe_in_a_container_reports_the_same_pins(cpu_image, smoke_stack):
    result = verify_image_by_probe(cpu_image.tag, smoke_stack)
    assert result.matches, result.differences
    heads = {s["name"]: s["head"] for s in result.observed["sources"]}
    assert heads == {s["name"]: s["commit"] for s in smoke_stack.sources}
    assert result.observed["packages"]["torch"] == "2.13.0+cpu"
    assert result.observed["python"]["version"] == "3.11.2"
    cli = run_kit("verify", "--image", cpu_image.tag, "--arm", "smoke", "--json")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert json.loads(cli.stdout)["results"][0]["status"] == "ok"
    vime = next(s for s in result.observed["sources"] if s["name"] == "vime")
    assert vime["worktree_tree"] == smoke_stack.source("vime")["tree"] != vime["commit_tree"]   # patch applied


def test_second_build_is_a_cache_hit_with_the_same_image_id(cpu_image, kit_workspace):
    """Two builds back to back: the second is a full cache hit with the same tag and image id.

    (Not compared with the session image: in a shared checkout the kit's own files, which the image
    contains, may change between the two, and then a new tag is the correct outcome; the pair is
    then made again, a few times at most.)
    """
    args = ["build", "cpu", "--arm", "smoke", "--json", "--workspace", str(kit_workspace)]
    for name, path in sorted(cpu_image.sources.items()):
        args += ["--source", f"{name}={path}"]
    for _ in range(4):
        first = run_kit(*args)
        second = run_kit(*args)
        assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
        a, b = json.loads(first.stdout), json.loads(second.stdout)
        if a["inputs_sha256"] == b["inputs_sha256"]:
            break
    if a["tag"] == cpu_image.tag:
        assert a["image_id"] == cpu_image.image_id
    assert b["tag"] == a["tag"] and b["image_id"] == a["image_id"]
    assert b["cached"] is True
    assert b["inputs_sha256"] == a["inputs_sha256"]
    # The tag already holds an image of these inputs: no context goes to the engine, no step runs.
    assert b["steps"] == 0 and "context" not in b, b
    # Measured at about 0.2 s (plan + lookup + record); the bound is 3 s.
    assert b["durations_s"]["total"] < 3.0, b["durations_s"]
    assert b["conformance_fingerprint"] == a["conformance_fingerprint"]


def test_another_clone_of_equal_inputs_gets_the_same_image(cpu_image, kit_workspace, docker_engine, tmp_path):
    """Another clone of the kit (other path, other origin, other commit, same files) plans the same
    inputs: it gets the same tag and the same image id, and only its build record names its checkout."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    clone = tmp_path / "another-clone"
    for name in filter(None, files):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    git = ["git", "-C", str(clone), "-c", "user.name=other", "-c", "user.email=other@example.invalid"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "another clone"],
                 ["remote", "add", "origin", "https://example.invalid/another-clone.git"]):
        subprocess.run(git + step, check=True, capture_output=True)
    args = ["build", "cpu", "--arm", "smoke", "--json", "--workspace", str(kit_workspace)]
    for name, path in sorted(cpu_image.sources.items()):
        args += ["--source", f"{name}={path}"]
    proc = run_kit(*args, cwd=clone, env={"PYTHONPATH": str(clone)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout)
    assert theirs["tag"] == cpu_image.tag and theirs["image_id"] == cpu_image.image_id, theirs
    assert theirs["steps"] == 0     # equal inputs: the image is reused as it is
    assert theirs["checkout"]["source"] == "https://example.invalid/another-clone.git"
    assert theirs["checkout"]["revision"] != cpu_image.record["checkout"]["revision"]


def test_source_at_another_commit_fails_naming_source_and_both_commits(cpu_image, kit_workspace, tmp_path):
    repo = tmp_path / "rl-kernel"
    shutil.copytree(cpu_image.sources["rl-kernel"], repo)
    moved = smoke_sources.extra_commit(repo)
    pin = smoke_sources.FIXTURE_COMMITS["rl-kernel"]
    proc = run_kit("build", "cpu", "--arm", "smoke", "--workspace", str(kit_workspace), "--source", f"rl-kernel={repo}")
    assert proc.returncode == 1, proc.stderr
    assert "rl-kernel" in proc.stderr and moved in proc.stderr and pin in proc.stderr


def test_dirty_checkout_is_refused(cpu_image, kit_workspace, tmp_path):
    repo = tmp_path / "vime"
    shutil.copytree(cpu_image.sources["vime"], repo)
    (repo / "README.md").write_text("edited\n")
    proc = run_kit("build", "cpu", "--arm", "smoke", "--workspace", str(kit_workspace), "--source", f"vime={repo}")
    assert proc.returncode == 2 and "uncommitted changes" in proc.stderr and "vime" in proc.stderr


def test_patch_with_another_sha256_fails(cpu_image, kit_workspace, tmp_path):
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    patch = manifests / "patches" / "smoke-vime.patch"
    patch.write_text(patch.read_text() + "\n")     # still applies, different bytes
    proc = run_kit("build", "cpu", "--arm", "smoke", "--workspace", str(kit_workspace),
                   *[a for n, p in sorted(cpu_image.sources.items()) for a in ("--source", f"{n}={p}")],
                   env={"KIT_MANIFESTS": str(manifests)})
    assert proc.returncode == 1, proc.stderr
    assert "smoke-vime.patch" in proc.stderr and "a9b63a450995ca123e6b67b70e938dfdcce08fd6c40f9634e5f5ed9f274085df" in proc.stderr


def tampered_image(docker_engine, image: str, script: str, repository: str):
    """``image`` with ``script`` run in it, committed: what someone editing a built image leaves."""
    container = docker_engine.containers.run(image, ["sh", "-c", script], detach=True)
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0
        return container.commit(repository=repository, tag="latest")
    finally:
        container.remove(force=True)


def test_edited_baked_source_fails_verification_naming_it(cpu_image, smoke_stack, docker_engine):
    tampered = tampered_image(docker_engine, cpu_image.tag, "echo tampered >> /opt/rlk/src/rl-kernel/rl_kernel/__init__.py",
                              "rlk-kit/test-tampered")
    try:
        assert check_image(tampered.id, smoke_stack).matches    # labels alone cannot see it ...
        result = verify_image_by_probe(tampered.id, smoke_stack)  # ... the probe can
        assert not result.matches
        fields = [f for f, _, _ in result.differences]
        assert fields == ["sources.rl-kernel.tree"], result.differences
        cli = run_kit("verify", "--image", tampered.id, "--arm", "smoke")
        assert cli.returncode == 1 and "FAIL" in cli.stdout
        assert "probe sources.rl-kernel.tree" in cli.stdout, cli.stdout
    finally:
        docker_engine.images.remove(tampered.id, force=True)


def test_added_compiled_extension_fails_verification_though_git_ignores_it(cpu_image, smoke_stack, docker_engine):
    """build/ is git-ignored in the sources, so the tree cannot see a .so there; the build-time probe can."""
    tampered = tampered_image(docker_engine, cpu_image.tag,
                              "mkdir -p /opt/rlk/src/rl-kernel/build && echo elf > /opt/rlk/src/rl-kernel/build/_C.so",
                              "rlk-kit/test-extension")
    try:
        result = verify_image_by_probe(tampered.id, smoke_stack)
        assert result.differences == [("sources.rl-kernel.extensions.build/_C.so", None,
                                       hashlib.sha256(b"elf\n").hexdigest())], result.differences
        cli = run_kit("verify", "--image", tampered.id, "--arm", "smoke")
        assert cli.returncode == 1 and "sources.rl-kernel.extensions.build/_C.so" in cli.stdout, cli.stdout
    finally:
        docker_engine.images.remove(tampered.id, force=True)


def test_verify_image_without_arm_uses_the_stack_its_label_names(cpu_image):
    cli = run_kit("verify", "--image", cpu_image.tag, "--json")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    result = json.loads(cli.stdout)["results"][0]
    assert result["status"] == "ok"
    assert any("dev.rlk-kit.stack.name" in n and "'smoke'" in n for n in result["notes"]), result["notes"]
    text = run_kit("verify", "--image", cpu_image.tag)
    assert text.returncode == 0 and "from the image's dev.rlk-kit.stack.name label" in text.stdout
    both = run_kit("verify", "--image", cpu_image.tag, "--arm", "smoke", "--stack", "smoke")
    assert both.returncode == 2 and "at most one" in both.stderr


def test_probe_uses_the_kit_entrypoint_whatever_the_image_default(cpu_image, smoke_stack, docker_engine):
    container = docker_engine.containers.create(cpu_image.tag, command=["true"])
    try:
        changed = container.commit(repository="rlk-kit/test-entrypoint", tag="latest",
                                   changes=['ENTRYPOINT ["/bin/false"]'])
    finally:
        container.remove(force=True)
    try:
        assert docker_engine.images.get(changed.id).attrs["Config"]["Entrypoint"] == ["/bin/false"]
        result = verify_image_by_probe(changed.id, smoke_stack)
        assert result.matches, result.differences
        assert result.observed["python"]["executable"].startswith("/opt/rlk/venv/")
    finally:
        docker_engine.images.remove(changed.id, force=True)


def test_missing_digest_pinned_base_is_exit_2_saying_how_to_load_it(docker_engine, kit_workspace):
    import docker

    # a digest no engine holds: the engine's own lookup, the refusal and its advice
    absent = "nvidia/cuda@sha256:" + "0" * 64
    with pytest.raises(BadInput, match="docker load"):
        base_image_id(docker_engine, absent, stack_name="vime-g10", platform="cuda")
    base = Catalog.default().stack("vime-g10").base_image("cuda")
    try:
        docker_engine.images.get(base)
        present = True
    except docker.errors.ImageNotFound:
        present = False
    if not present:             # the CLI path too, where the real base is absent (CI: no registry)
        proc = run_kit("build", "cuda", "--arm", "G10", "--workspace", str(kit_workspace))
        assert proc.returncode == 2, proc.stderr
        assert base in proc.stderr and "docker pull" in proc.stderr and "docker load" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_check_image_reports_another_stacks_pins(cpu_image):
    other = Catalog.default().stack("smoke").document | {"python": "3.11.9"}
    check = check_image(cpu_image.tag, other)
    assert not check.matches
    assert ("dev.rlk-kit.python", "3.11.9", "3.11.2") in check.differences


def test_no_engine_and_missing_base_are_exit_2(docker_engine, kit_workspace, tmp_path):
    proc = run_kit("build", "cpu", "--arm", "smoke", "--workspace", str(kit_workspace),
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert proc.returncode == 2 and "no Docker engine answers" in proc.stderr and "dockerd" in proc.stderr
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    stack_file = manifests / "stack-smoke.json"
    stack_file.write_text(stack_file.read_text().replace("rlk-kit/debian-base:bookworm", "rlk-kit/debian-base:absent"))
    proc = run_kit("build", "cpu", "--stack", "smoke", "--workspace", str(kit_workspace),
                   env={"KIT_MANIFESTS": str(manifests)})
    assert proc.returncode == 2 and "make-base-image.sh" in proc.stderr, proc.stderr


def test_verify_image_of_a_non_kit_image_is_bad_input_and_leaves_no_container(docker_engine):
    def of_the_image():   # only containers of this image: other work may start containers meanwhile
        return {c.id for c in docker_engine.containers.list(all=True, filters={"ancestor": "rlk-kit/debian-base:bookworm"})}

    before = of_the_image()
    proc = run_kit("verify", "--image", "rlk-kit/debian-base:bookworm", "--arm", "smoke")
    assert proc.returncode == 2, proc.stderr
    assert "cannot run the kit probe" in proc.stderr and "Traceback" not in proc.stderr
    assert of_the_image() <= before


def test_dry_run_names_the_tag_a_build_makes(cpu_image, kit_workspace):
    """The tagged base's local id enters the inputs; a dry run that can ask the engine uses it too."""
    args = ["build", "cpu", "--arm", "smoke", "--json", "--workspace", str(kit_workspace)]
    for name, path in sorted(cpu_image.sources.items()):
        args += ["--source", f"{name}={path}"]
    dry, real = run_kit(*args, "--dry-run"), run_kit(*args)
    assert dry.returncode == 0 and real.returncode == 0, dry.stderr + real.stderr
    assert json.loads(dry.stdout)["tag"] == json.loads(real.stdout)["tag"]
    assert "provisional" not in dry.stdout
