"""Arms layered like stacks: consistency extends native and overrides its operators and comparison."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.model.arm import merge_arm, resolve_arm_document
from kit.model.catalog import Catalog
from kit.model.errors import BadInput

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


@pytest.fixture
def manifests(tmp_path):
    out = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, out)
    return out


def test_consistency_is_native_with_strict_operators():
    catalog = Catalog.load(MANIFESTS)
    native, consistency = catalog.arm("native").document, catalog.arm("consistency").document
    raw = json.loads((MANIFESTS / "consistency.json").read_text())
    assert raw["extends"] == "native" and "workload" not in raw and len(raw) <= 7
    assert consistency["operators"] == {"attention": "R/R", "ffn": "R/R", "logp": "R/R"}
    assert consistency["comparison"] == {"with": "native", "factors": ["operators"]}
    same = {k for k in native if k not in ("schema", "name", "description", "operators", "comparison")}
    assert all(native[k] == consistency[k] for k in same) and "extends" not in consistency


def test_objects_merge_per_key_and_the_comparison_is_never_inherited():
    parent = {"name": "p", "workload": {"seed": 1, "kl": {"coef": 0.0, "use": False}}, "comparison": {"with": "x"}}
    child = {"name": "c", "extends": "p", "workload": {"kl": {"coef": 0.1}}}
    resolved = resolve_arm_document(child, {"p": parent}.get)
    assert resolved == {"name": "c", "workload": {"seed": 1, "kl": {"coef": 0.1, "use": False}}}
    assert merge_arm({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}


def test_unknown_parent_and_loops_are_named(manifests):
    with pytest.raises(ValueError, match="extends unknown arm 'nope'"):
        resolve_arm_document({"name": "c", "extends": "nope"}, {}.get)
    with pytest.raises(ValueError, match="loop"):
        docs = {"a": {"name": "a", "extends": "b"}, "b": {"name": "b", "extends": "a"}}
        resolve_arm_document(docs["a"], docs.get)
    path = manifests / "consistency.json"
    doc = json.loads(path.read_text())
    doc["extends"] = "nope"
    path.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "kit", "verify", str(path)], capture_output=True, text=True)
    assert proc.returncode == 1 and "/extends" in proc.stdout and "'nope'" in proc.stdout
    with pytest.raises(BadInput, match="nope"):
        Catalog.load(manifests).arm("consistency", flag="--arm")


def test_a_child_that_breaks_a_rule_fails_on_its_resolved_form(manifests):
    path = manifests / "consistency.json"
    doc = json.loads(path.read_text())
    doc["workload"] = {"global_batch_size": 3}
    path.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "kit", "verify", str(path)], capture_output=True, text=True)
    assert proc.returncode == 1 and "/workload/global_batch_size" in proc.stdout
