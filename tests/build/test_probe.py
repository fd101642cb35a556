"""The probe on fixture repositories: schema, pins held, edits and other commits detected."""

from __future__ import annotations

import json
import platform
import re
import sys

import pytest

from kit.build import smoke_sources
from kit.model.catalog import Catalog
from kit.model.documents import schema_problems
from kit.build.probe import identity_differences, observed_identity

from conftest import run_kit


@pytest.fixture()
def repos(tmp_path):
    out = {n: smoke_sources.materialize(n, tmp_path / n) for n in smoke_sources.fixture_names()}
    stack = Catalog.default().stack("smoke")
    patch = Catalog.default().directory / stack.source("vime")["patches"][0]["path"]
    smoke_sources.git(out["vime"], "apply", "--index", str(patch))
    return out


@pytest.fixture()
def host_stack():
    """The smoke stack with this host's python and installed versions, so only sources can differ."""
    doc = json.loads(json.dumps(Catalog.default().stack("smoke").document))
    doc["python"] = platform.python_version()
    from importlib import metadata
    doc["packages"] = {n: metadata.version(n) for n in ("click", "jsonschema")}
    return doc


def test_probe_document_is_valid_and_pins_hold(repos, host_stack):
    observed = observed_identity(host_stack, source_roots=repos, include_conformance=False)
    assert schema_problems(observed) == []
    assert identity_differences(observed, host_stack) == []
    assert {s["name"]: s["head"] for s in observed["sources"]} == smoke_sources.FIXTURE_COMMITS
    assert any(line.lower().startswith("click==") for line in observed["freeze"])
    assert observed["torch"]["version"].startswith("2.")


def test_edited_file_and_other_commit_are_differences(repos, host_stack):
    (repos["megatron-lm"] / "megatron" / "core" / "__init__.py").write_text("edited = True\n")
    moved = smoke_sources.extra_commit(repos["rl-kernel"])
    diffs = identity_differences(observed_identity(host_stack, source_roots=repos, include_conformance=False), host_stack)
    fields = {f: (e, o) for f, e, o in diffs}
    assert fields["sources.rl-kernel.commit"] == (smoke_sources.FIXTURE_COMMITS["rl-kernel"], moved)
    assert "sources.megatron-lm.tree" in fields
    assert "sources.vime.tree" not in fields


def test_ignored_build_products_are_not_differences(repos, host_stack):
    cache = repos["rl-kernel"] / "rl_kernel" / "__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    observed = observed_identity(host_stack, source_roots=repos, include_conformance=False)
    assert identity_differences(observed, host_stack) == []


def test_package_and_python_mismatches_are_reported(repos, host_stack):
    stack = dict(host_stack, python="3.0.0", packages={"click": "0.0.1", "no-such-dist": "1.0.0"})
    diffs = identity_differences(observed_identity(stack, source_roots=repos, include_conformance=False), stack)
    assert ("python", "3.0.0", platform.python_version()) in diffs
    assert ("packages.no-such-dist", "1.0.0", None) in diffs
    assert any(f == "packages.click" for f, _, _ in diffs)


def test_missing_source_is_reported_not_raised(tmp_path, host_stack):
    observed = observed_identity(host_stack, source_roots={"rl-kernel": tmp_path / "absent"}, include_conformance=False)
    diffs = identity_differences(observed, host_stack)
    assert [f for f, _, _ in diffs if f.endswith(".commit")] == [
        "sources.rl-kernel.commit", "sources.vime.commit", "sources.megatron-lm.commit"]


def test_cli_check_stack_exit_codes(repos, host_stack, tmp_path):
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(host_stack))
    roots = [a for n, p in repos.items() for a in ("--source-root", f"{n}={p}")]
    ok = run_kit("probe", "--json", "--no-conformance", "--check-stack", str(stack_file), *roots)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["differences"] == []
    (repos["vime"] / "README.md").write_text("edited\n")
    bad = run_kit("probe", "--no-conformance", "--check-stack", str(stack_file), *roots)
    assert bad.returncode == 1 and "sources.vime.tree" in bad.stderr
    missing = run_kit("probe", "--check-stack", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_probe_document_carries_the_conformance_fingerprint(repos, host_stack):
    observed = observed_identity(host_stack, source_roots=repos)
    assert schema_problems(observed) == []
    # A 64-hex string comes only from rlk_kernels.conformance; any failure would be {"error": ...}.
    assert re.fullmatch(r"[0-9a-f]{64}", observed["conformance_fingerprint"]), observed["conformance_fingerprint"]


def test_a_missing_fingerprint_is_stated_not_dropped(repos, host_stack, monkeypatch):
    monkeypatch.setitem(sys.modules, "rlk_kernels.conformance", None)   # import fails
    observed = observed_identity(host_stack, source_roots=repos)
    assert schema_problems(observed) == []
    assert "rlk_kernels.conformance is not importable" in observed["conformance_fingerprint"]["error"]
    assert "conformance_fingerprint" not in observed_identity(host_stack, source_roots=repos, include_conformance=False)


def test_extension_differences_name_removed_changed_and_added_objects():
    from kit.build.probe import extension_differences

    at_build = {"sources": [{"name": "rl-kernel", "extensions": {"a.so": "1" * 64, "b.so": "2" * 64}}]}
    now = {"sources": [{"name": "rl-kernel", "extensions": {"b.so": "3" * 64, "c.so": "4" * 64}},
                       {"name": "vime", "extensions": {"x.so": "5" * 64}}]}   # not in the build record: not judged
    assert extension_differences(now, at_build) == [
        ("sources.rl-kernel.extensions.a.so", "1" * 64, None),
        ("sources.rl-kernel.extensions.b.so", "2" * 64, "3" * 64),
        ("sources.rl-kernel.extensions.c.so", None, "4" * 64),
    ]
    assert extension_differences(at_build, at_build) == []
