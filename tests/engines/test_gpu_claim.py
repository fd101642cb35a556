"""The committed GPU claim: its six sealed runs (gpu-native fused production P/P against gpu-consistency R/R,
seeds 1-3, made on the GPU machine by ``kit run --claim``), its verdict and its page, checked on the CPU: every
run verifies, the verdict verifies, evaluating the sealed claim again over the committed runs gives the
committed verdict, and the pair of each seed is a controlled comparison."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import run_kit
from kit.model.documents import read_json_file

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "tests" / "data" / "gpu-claim"
CLAIM = REPO / "manifests" / "claims" / "gpu-strict-tax.sealed.json"
PAGE = REPO / "docs" / "reports" / "gpu-strict-tax"


def run_dirs() -> list[Path]:
    dirs = sorted(RUNS.glob("gpu-strict-tax-*"))
    assert [d.name for d in dirs] == [f"gpu-strict-tax-{role}-s{seed}" for role in ("reference", "treatment")
                                      for seed in (1, 2, 3)]
    return dirs


def test_every_committed_run_and_the_verdict_verify():
    proc = run_kit("verify", *map(str, run_dirs()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_kit("verify", str(PAGE / "verdict.json"), str(CLAIM))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict not supported of claim gpu-strict-tax" in proc.stdout


def test_the_runs_were_made_for_the_claim_on_a_hopper_gpu():
    claim_sha = read_json_file(CLAIM)["sealed"]["claim_sha256"]
    for run_dir in run_dirs():
        manifest = read_json_file(run_dir / "manifest.json")
        assert manifest["claim"]["sha256"] == claim_sha and manifest["claim"]["name"] == "gpu-strict-tax"
        accel = manifest["runtime"]["accelerator"]
        assert re.fullmatch(r"NVIDIA H(100|200).*", accel["device"]["name"])
        assert accel["conformance"]["fingerprint"] == "9fd8fc0ad901e66cd64d2902dd559dd503e3ad54bf9ff2f2426d45d86b7ccd93"


def test_evaluating_the_claim_again_gives_the_committed_verdict(tmp_path):
    out = tmp_path / "verdict.json"
    proc = run_kit("claim", "evaluate", str(CLAIM), *map(str, run_dirs()), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr              # exit 1: any verdict but supported
    got, committed = read_json_file(out), read_json_file(PAGE / "verdict.json")
    assert got["verdict"] == committed["verdict"] == "not supported"
    by_name = {c["name"]: c for c in got["criteria"]}
    assert {n: c["verdict"] for n, c in by_name.items()} == {"step-time": "not supported", "mismatches": "supported"}
    assert json.dumps([c["statistics"] for c in got["criteria"]], sort_keys=True) == \
        json.dumps([c["statistics"] for c in committed["criteria"]], sort_keys=True)
    ratio = by_name["step-time"]["statistics"]["ratio"]
    assert 1.10 < ratio["ci95_low"] <= ratio["estimate"] <= ratio["ci95_high"]
    totals = by_name["mismatches"]["statistics"]["totals"]
    assert totals["treatment_mismatches"] == 0 and totals["treatment_tokens"] >= 10**6
    assert totals["reference_mismatches"] > 0


def test_each_seed_is_a_controlled_pair_and_analyses(tmp_path):
    dirs = {d.name: d for d in run_dirs()}
    for seed in (1, 2, 3):
        ref, treat = dirs[f"gpu-strict-tax-reference-s{seed}"], dirs[f"gpu-strict-tax-treatment-s{seed}"]
        proc = run_kit("compare", str(ref), str(treat))
        assert proc.returncode == 0 and "controlled" in proc.stdout, proc.stdout + proc.stderr
    proc = run_kit("analyze", "perf", str(dirs["gpu-strict-tax-reference-s1"]),
                   str(dirs["gpu-strict-tax-treatment-s1"]), "--out", str(tmp_path / "perf"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "perf" / "monitors.png").is_file()


def test_the_committed_page_is_self_contained_and_states_the_verdict():
    page = (PAGE / "index.html").read_text()
    assert "NOT SUPPORTED" in page.upper() and "gpu-strict-tax" in page
    assert not re.search(r"""(src|href)=["']https?:""", page)
