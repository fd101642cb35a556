"""Wrong-typed fields that reach Python before the schema: one line naming the file and pointer, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.model.arm import resolve_arm_document
from kit.model.stack import StackResolutionError, resolve_stack_document

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("extends", [["native"], {"name": "native"}, 5, True, None, ""])
def test_an_arm_extends_that_is_not_a_name_is_refused(extends):
    with pytest.raises(ValueError, match=r"^/extends: .*expected the name of one arm \(a string\)"):
        resolve_arm_document({"name": "a", "extends": extends}, lambda n: {"name": n})


@pytest.mark.parametrize("extends, pointer", [(3, "/extends"), ([{"a": 1}], "/extends/0"), (["x", ["y"]], "/extends/1")])
def test_a_stack_extends_that_is_not_names_is_refused(extends, pointer):
    with pytest.raises(StackResolutionError) as err:
        resolve_stack_document({"name": "s", "extends": extends}, lambda n: {"name": n})
    assert err.value.pointer == pointer


def test_compare_with_an_arm_whose_extends_is_a_list(tmp_path):
    for path in (ROOT / "manifests").glob("*.json"):
        shutil.copy(path, tmp_path)
    doc = json.loads((tmp_path / "consistency.json").read_text())
    doc.update(name="listed", extends=["native"])
    (tmp_path / "listed.json").write_text(json.dumps(doc))
    result = CliRunner().invoke(cli, ["compare", str(tmp_path / "smoke.json"), str(tmp_path / "listed.json")])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = result.output.strip()
    assert "\n" not in line and str(tmp_path / "listed.json") in line and "/extends" in line and "a string" in line
