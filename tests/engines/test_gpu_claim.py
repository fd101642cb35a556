"""The committed GPU claims: each one's sealed runs (fused production P/P against strict R/R, seeds 1-3 or
1-4, made on the GPU machine by ``kit run --claim``), its verdict and its page, checked on the CPU: every run
verifies, the verdict verifies, evaluating the sealed claim again over the committed runs gives the committed
verdict, and the pair of each seed is a controlled comparison.

- ``gpu-strict-tax``: gpu-native against gpu-consistency (canonical width 8): not supported (step time 1.244);
- ``gpu-strict-tax-w1``: gpu-native-w1 against gpu-consistency-w1 (canonical width 1, the TP1-only contract):
  inconclusive (step time 1.102, its 95 % interval contains the bound 1.10);
- ``gpu-strict-tax-w1-logits``: the same arms, the strict log-prob from the LM head's bf16 logits:
  inconclusive (step time 1.151 [1.099, 1.212]);
- ``gpu-strict-tax-w1-graphs``: the width-1 arms with rollout decode steps as CUDA graphs on both sides:
  supported (step time 1.055 [1.028, 1.085]);
- ``gpu-strict-tax-w1-graphs-5pct``: the same arms at a 5 % bound, the same strict bits with less work around
  them: inconclusive (step time 1.027 [1.001, 1.059]);
- ``gpu-strict-tax-w1-graphs-5pct-4seeds``: the same arms and bound over 4 seeds, decode over one key split
  written by its split kernel (the same bits): supported (step time 1.021 [1.005, 1.040])."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_kit
from kit.model.documents import read_json_file

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Claim:
    name: str
    runs: str                      # under tests/data
    verdict: str
    step_time: str                 # the step-time criterion's verdict
    fingerprint: str               # the qwen3-8b oracle's, as the runs' GPU computed it (the kernels' revision)
    seeds: tuple[int, ...] = (1, 2, 3)

    @property
    def sealed(self) -> Path:
        return REPO / "manifests" / "claims" / f"{self.name}.sealed.json"

    @property
    def page(self) -> Path:
        return REPO / "docs" / "reports" / self.name


GLUE = "9fd8fc0ad901e66cd64d2902dd559dd503e3ad54bf9ff2f2426d45d86b7ccd93"           # the q/k/v glue in one launch
LOGITS = "59f3ccf6acc2be3f162f431a0cc43e2a436d84bfbbca07faedbbaf4d2bb63331"          # the log-prob from bf16 logits
CLAIMS = [Claim("gpu-strict-tax", "gpu-claim", "not supported", "not supported", GLUE),
          Claim("gpu-strict-tax-w1", "gpu-claim-w1", "inconclusive", "inconclusive", GLUE),
          Claim("gpu-strict-tax-w1-logits", "gpu-claim-w1-logits", "inconclusive", "inconclusive", LOGITS),
          Claim("gpu-strict-tax-w1-graphs", "gpu-claim-w1-graphs", "supported", "supported", LOGITS),
          Claim("gpu-strict-tax-w1-graphs-5pct", "gpu-claim-w1-graphs-5pct", "inconclusive", "inconclusive", LOGITS),
          Claim("gpu-strict-tax-w1-graphs-5pct-4seeds", "gpu-claim-w1-graphs-5pct-4seeds", "supported", "supported",
                LOGITS, seeds=(1, 2, 3, 4))]
each_claim = pytest.mark.parametrize("claim", CLAIMS, ids=[c.name for c in CLAIMS])


def run_dirs(claim: Claim) -> list[Path]:
    dirs = sorted((REPO / "tests" / "data" / claim.runs).glob(f"{claim.name}-*"))
    assert [d.name for d in dirs] == [f"{claim.name}-{role}-s{seed}" for role in ("reference", "treatment")
                                      for seed in claim.seeds]
    return dirs


@each_claim
def test_every_committed_run_and_the_verdict_verify(claim):
    proc = run_kit("verify", *map(str, run_dirs(claim)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_kit("verify", str(claim.page / "verdict.json"), str(claim.sealed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"verdict {claim.verdict} of claim {claim.name}" in proc.stdout


@each_claim
def test_the_runs_were_made_for_the_claim_on_a_hopper_gpu(claim):
    claim_sha = read_json_file(claim.sealed)["sealed"]["claim_sha256"]
    for run_dir in run_dirs(claim):
        manifest = read_json_file(run_dir / "manifest.json")
        assert manifest["claim"]["sha256"] == claim_sha and manifest["claim"]["name"] == claim.name
        accel = manifest["runtime"]["accelerator"]
        assert re.fullmatch(r"NVIDIA H(100|200).*", accel["device"]["name"])
        assert accel["conformance"]["fingerprint"] == claim.fingerprint


@each_claim
def test_evaluating_the_claim_again_gives_the_committed_verdict(claim, tmp_path):
    out = tmp_path / "verdict.json"
    proc = run_kit("claim", "evaluate", str(claim.sealed), *map(str, run_dirs(claim)), "--out", str(out))
    assert proc.returncode == (0 if claim.verdict == "supported" else 1), proc.stdout + proc.stderr
    got, committed = read_json_file(out), read_json_file(claim.page / "verdict.json")
    assert got["verdict"] == committed["verdict"] == claim.verdict
    by_name = {c["name"]: c for c in got["criteria"]}
    assert {n: c["verdict"] for n, c in by_name.items()} == {"step-time": claim.step_time, "mismatches": "supported"}
    assert json.dumps([c["statistics"] for c in got["criteria"]], sort_keys=True) == \
        json.dumps([c["statistics"] for c in committed["criteria"]], sort_keys=True)
    ratio = by_name["step-time"]["statistics"]["ratio"]
    assert ratio["ci95_low"] <= ratio["estimate"] <= ratio["ci95_high"]
    bound = next(c["rule"]["bound"] for c in read_json_file(claim.sealed)["criteria"] if c["name"] == "step-time")
    bound_side = {"supported": ratio["ci95_high"] <= bound, "not supported": bound < ratio["ci95_low"],
                  "inconclusive": ratio["ci95_low"] <= bound < ratio["ci95_high"]}
    assert bound_side[claim.step_time]
    totals = by_name["mismatches"]["statistics"]["totals"]
    assert totals["treatment_mismatches"] == 0 and totals["treatment_tokens"] >= 10**6
    assert totals["reference_mismatches"] > 0


@each_claim
def test_each_seed_is_a_controlled_pair_and_analyses(claim, tmp_path):
    dirs = {d.name: d for d in run_dirs(claim)}
    for seed in claim.seeds:
        ref, treat = dirs[f"{claim.name}-reference-s{seed}"], dirs[f"{claim.name}-treatment-s{seed}"]
        proc = run_kit("compare", str(ref), str(treat))
        assert proc.returncode == 0 and "controlled" in proc.stdout, proc.stdout + proc.stderr
    proc = run_kit("analyze", "perf", str(dirs[f"{claim.name}-reference-s1"]),
                   str(dirs[f"{claim.name}-treatment-s1"]), "--out", str(tmp_path / "perf"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "perf" / "monitors.png").is_file()


@each_claim
def test_the_committed_page_is_self_contained_and_states_the_verdict(claim):
    page = (claim.page / "index.html").read_text()
    assert claim.verdict.upper() in page.upper() and claim.name in page
    assert not re.search(r"""(src|href)=["']https?:""", page)
