"""Gate sets are data: the shipped set validates against its schema, a threshold is one edit in the data,
a broken set is bad input naming the gate, and the version reaches validation.json."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

from kit.gates.engine import GATE_SET_VERSION, GATES, evaluate, gate_set_from_document
from kit.gates.rules import CONDITIONS, RULES, RunEvidence
from kit.model.catalog import Catalog
from kit.model.documents import schema_problems
from kit.model.errors import BadInput


def shipped() -> dict:
    return json.loads(resources.files("kit.gates").joinpath("sets", "rlk-kit-gates.v2.json").read_text())


def strict_evidence(max_diff: float) -> RunEvidence:
    arm = copy.deepcopy(Catalog.default().arm("smoke").document)
    arm["workload"]["rollouts"] = 1
    line = ("step 0: {'train/train_current_rollout_logprob_mismatch_count': 0.0, "
            f"'train/train_current_rollout_logprob_max_abs_diff': {max_diff}, "
            "'train/train_current_rollout_logprob_numel': 10.0}")
    return RunEvidence(arm=arm, job_status="SUCCEEDED", engine_lines=[line])


def test_the_shipped_gate_set_is_valid_data_with_known_rules_and_conditions():
    doc = shipped()
    assert schema_problems(doc, "gate-set") == []
    assert doc["version"] == GATE_SET_VERSION
    assert {g["rule"] for g in doc["gates"]} <= set(RULES) and {g["applies"] for g in doc["gates"]} <= set(CONDITIONS)
    assert [g.id for g in GATES] == [g["id"] for g in doc["gates"]]


def test_a_threshold_is_one_edit_in_the_data_file():
    ev = strict_evidence(1e-7)
    default = {g["id"]: g["status"] for g in evaluate(ev, run_id="r")["gates"]}
    assert default["rr-bitwise-zero"] == "failed"
    doc = shipped()
    doc["version"] = "rlk-kit-gates/99"
    next(g for g in doc["gates"] if g["id"] == "rr-bitwise-zero")["parameters"]["tolerance"] = 1e-6
    loose = gate_set_from_document(doc, "loose.json")
    report = evaluate(ev, run_id="r", gate_set=loose)
    assert {g["id"]: g["status"] for g in report["gates"]}["rr-bitwise-zero"] == "passed"
    assert report["gate_set_version"] == "rlk-kit-gates/99"
    assert schema_problems(report, "validation-report") == []


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["gates"][0].__setitem__("rule", "vibes"), "/gates/0/rule"),
    (lambda d: d["gates"][0].__setitem__("applies", "sometimes"), "/gates/0/applies"),
    (lambda d: d["gates"].append(dict(d["gates"][0])), "appears twice"),
    (lambda d: d["gates"][4]["parameters"].pop("max_hits"), "/gates/4/parameters"),
    (lambda d: d["gates"][2]["parameters"].__setitem__("tolerance", -1), "/gates/2/parameters/tolerance"),
    (lambda d: d.__setitem__("version", "two"), "/version"),
    (lambda d: d["gates"][6]["parameters"].__setitem__("color", "red"), "/gates/6/parameters"),
])
def test_a_broken_gate_set_is_bad_input_naming_the_gate(edit, says):
    doc = shipped()
    edit(doc)
    with pytest.raises(BadInput, match=says.replace("/", "/")):
        gate_set_from_document(doc, "broken.json")
