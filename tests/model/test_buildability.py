"""The buildability rules (kit/model/buildability.v1.json) and their engine, over plain stack documents."""

import pytest

from kit.model.buildability import buildability_findings, in_range, load_rules
from kit.model.catalog import Catalog
from kit.model.errors import BadInput

BASE = "nvidia/cuda:12.8.1-devel@sha256:" + "0" * 64


def _stack(name="s", **packages):
    return {"name": name, "packages": packages, "platforms": {"cuda": {"base_image": BASE}, "cpu": {"base_image": "debian"}}}


def test_te_2_18_beside_torch_2_9_is_refused_with_what_is_accepted():
    (f,) = buildability_findings(_stack(**{"transformer-engine": "2.18.0", "torch": "2.9.1", "vllm": "0.16.0"}), "cuda")
    assert f.rule == "te-torch-symm-mem-header"
    assert "ep.cpp" in f.message and "torch 2.9.1" in f.message
    assert "transformer-engine 2.11.0" in f.accept and "docs/cuda-image.md" in f.evidence
    assert buildability_findings(_stack(**{"transformer-engine": "2.11.0", "torch": "2.9.1"}), "cuda") == []
    assert buildability_findings(_stack(**{"transformer-engine": "2.18.0", "torch": "2.10.0"}), "cuda") == []
    # the evidence is for CUDA builds; the CPU platform is not judged by it
    assert buildability_findings(_stack(**{"transformer-engine": "2.18.0", "torch": "2.9.1"}), "cpu") == []


def test_vllm_torch_and_cuda_major_rules():
    (f,) = buildability_findings(_stack(vllm="0.16.0", torch="2.10.0"), "cuda")
    assert f.rule == "vllm-torch-pin" and "torch 2.10.0" in f.message
    assert buildability_findings(_stack(vllm="0.16.0", torch="2.9.1+cu128"), "cuda") == []
    (f,) = buildability_findings(_stack(**{"transformer-engine-cu13": "2.18.0"}), "cuda")
    assert f.rule == "cuda-major" and "CUDA 13" in f.message and "cu12" in f.accept


def test_ranges():
    assert in_range("2.18.0", ">=2.18.0,<2.19") and not in_range("2.19.0", ">=2.18.0,<2.19")
    assert in_range("2.9.1+rocm6.3", "<2.10") and not in_range("2.9.1+cu128", "!=2.9.1")
    with pytest.raises(BadInput, match="OP VERSION"):
        in_range("1.0", "~=1.0")


def test_shipped_stacks_and_the_historical_g10_note():
    assert load_rules()
    catalog = Catalog.default()
    found = {n: [f.rule for f in buildability_findings(catalog.stack(n).document)]
             for n in catalog.stack_docs if not catalog.stack(n).abstract}
    assert found["vime-g11"] == found["vime-current"] == found["smoke"] == []
    assert found["vime-g10"] == ["te-torch-symm-mem-header"]
    (g10,) = buildability_findings(catalog.stack("vime-g10").document)
    assert "not rebuildable from source" in g10.text()
