"""The real smoke workload (rlk_kernels.smoke) prints VIME records that `kit analyze` reads unchanged."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.engines.vime.records import parse_records

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = 3


def run_smoke(tmp_path: Path, name: str, case: str) -> Path:
    arm = json.loads((ROOT / "manifests" / "smoke.json").read_text())
    arm["name"] = name
    arm["operators"] = {"attention": case, "ffn": case, "logp": case}
    arm.pop("comparison", None)
    arm_file = tmp_path / f"{name}.arm.json"
    arm_file.write_text(json.dumps(arm))
    log = tmp_path / f"{name}.log"
    with open(log, "w") as fh:
        subprocess.run([sys.executable, "-m", "rlk_kernels.smoke", "--arm-file", str(arm_file),
                        "--rollouts", str(ROLLOUTS)], stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=300)
    return log


@pytest.fixture(scope="module")
def smoke_logs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smoke")
    return run_smoke(tmp, "smoke-native", "P/P"), run_smoke(tmp, "smoke-strict", "R/R"), tmp


def test_smoke_logs_analyse_with_perf(smoke_logs):
    native, strict, tmp = smoke_logs
    result = CliRunner().invoke(cli, ["analyze", "perf", str(native), str(strict), "--out", str(tmp / "perf"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [(a["name"], a["steps"], a["global_batch_size"]) for a in doc["arms"]] == \
        [("smoke-native", ROLLOUTS, 16), ("smoke-strict", ROLLOUTS, 16)]
    assert doc["settings"]["pairing_used"] == "paired"
    assert doc["comparison"]["controlled"] is False  # bare logs
    assert doc["subsets"]["all"]["arms"]["smoke-native"]["metrics"]["step_time_s"]["n"] == ROLLOUTS
    assert (tmp / "perf" / "performance-decomposition.png").is_file()


def test_smoke_logs_analyse_with_convergence(smoke_logs):
    native, strict, tmp = smoke_logs
    result = CliRunner().invoke(cli, ["analyze", "convergence", str(native), str(strict), "--out", str(tmp / "conv"),
                                      "--no-figures", "--json"])
    assert result.exit_code == 0, result.output
    groups = {s["group"]: s for s in json.loads(result.output)["summaries"]}
    assert groups["smoke-native"]["bitwise_mismatch_count"] > 0
    assert groups["smoke-strict"]["bitwise_mismatch_count"] == 0 and groups["smoke-strict"]["max_abs_dlogp"] == 0
    # token totals are the logged per-sample means times the logged global batch size
    numel = [r.payload["train/train_current_rollout_logprob_numel"] for r in parse_records(native.read_text().splitlines())
             if r.kind == "step"]
    assert groups["smoke-native"]["active_token_exposure"] == sum(n * 16 for n in numel)
    with open(tmp / "conv" / "rounds.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 2 * ROLLOUTS
