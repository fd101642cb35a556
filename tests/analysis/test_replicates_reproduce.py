"""Replicates (kit run --seeds), the noise floor (kit analyze replicates) and kit reproduce, on the smoke arm.

The acceptance run: 3 seeds x 2 modes (native, consistency); the noise-floor report says the native vs
consistency mismatch difference exceeds the noise floor, and kit reproduce on a consistency run says
"bitwise reproduced"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.model.documents import schema_problems
from kit.model.errors import BadInput
from kit.run.replicates import parse_seeds
from kit.run.reproduce import compare_records


def kit(*args, workspace: Path, timeout=900):
    env = dict(os.environ, KIT_WORKSPACE=str(workspace))
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_parse_seeds_names_what_is_wrong():
    assert parse_seeds("1,2,3") == [1, 2, 3]
    for bad in ("1,x", "1,1", "-1", ""):
        with pytest.raises(BadInput, match="--seeds"):
            parse_seeds(bad)


@pytest.fixture(scope="module")
def replicate_groups(tmp_path_factory):
    """Two smoke groups of 3 seeds x 2 rollouts: native (P/P) and consistency (R/R)."""
    ws = tmp_path_factory.mktemp("replicates")
    groups = {}
    for mode in ("native", "consistency"):
        proc = kit("run", "--arm", "smoke", "--mode", mode, "--seeds", "1,2,3", "--rollouts", "2", "--allow-dirty",
                   "--json", workspace=ws)
        assert proc.returncode == 0, proc.stderr[-2000:]
        groups[mode] = json.loads(proc.stdout)
    return ws, groups


@pytest.mark.slow
def test_seeds_make_one_sealed_run_per_seed_grouped(replicate_groups):
    ws, groups = replicate_groups
    for mode, group in groups.items():
        doc = json.loads((ws / "groups" / f"{group['group']}.json").read_text())
        assert doc == group and schema_problems(doc, "replicate-group") == []
        assert [r["seed"] for r in doc["runs"]] == [1, 2, 3] and all(r["sealed"] for r in doc["runs"])
        for r in doc["runs"]:
            manifest = json.loads((Path(r["run_dir"]) / "manifest.json").read_text())
            assert manifest["arm"]["workload"]["seed"] == r["seed"] == manifest["arm"]["workload"]["rollout_seed"]
            assert r["run_id"] == f"{group['group']}-s{r['seed']}"


@pytest.mark.slow
def test_noise_floor_says_the_mismatch_difference_exceeds_it(replicate_groups, tmp_path):
    ws, groups = replicate_groups
    docs = [str(ws / "groups" / f"{groups[m]['group']}.json") for m in ("native", "consistency")]
    proc = kit("analyze", "replicates", *docs, "--out", str(tmp_path / "noise"), "--draws", "500", workspace=ws)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "noise" / "replicates.json").read_text())
    assert schema_problems(doc, "analysis-replicates") == []
    native_arm, consistency_arm = groups["native"]["arm"], groups["consistency"]["arm"]   # smoke-native, smoke
    native = next(a for a in doc["arms"] if a["arm"] == native_arm)
    assert native["metrics"]["mismatch_count"]["noise_floor"]["seeds"] == 3
    diff = doc["differences"][0]
    assert (diff["reference"], diff["other"]) == (native_arm, consistency_arm)
    m = diff["metrics"]["mismatch_count"]
    assert m["exceeds_noise_floor"] is True and "exceeds the noise floor" in m["verdict"]
    assert m["difference"] < 0 and m["ci95_high"] < 0
    assert f"mismatch_count: {consistency_arm} - {native_arm}" in proc.stdout
    assert f"mismatch_count: {consistency_arm} - {native_arm}" in m["verdict"] and "exceeds the noise floor" in proc.stdout
    for ext, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF")):      # the figure: seed spread beside the arm gap
        assert (tmp_path / "noise" / f"noise-floor.{ext}").read_bytes().startswith(magic)


@pytest.mark.slow
def test_reproduce_a_consistency_run_bitwise(replicate_groups):
    ws, groups = replicate_groups
    original = Path(groups["consistency"]["runs"][0]["run_dir"])
    proc = kit("reproduce", str(original), "--allow-dirty", "--json", workspace=ws)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert schema_problems(report, "reproduction") == []
    assert report["verdict"] == "bitwise reproduced" and report["compared_values"] > 0
    repro = Path(report["reproduction"]["run_dir"])
    seal = json.loads((original / "seal.json").read_text())
    assert f"reproduction of run {original.name} ({original.resolve()}, seal root sha256 {seal['root_sha256']})" \
        in (repro / "kit.log").read_text()
    assert kit("verify", str(repro), workspace=ws).returncode == 0      # itself a sealed run
    assert (ws / "reproductions" / f"{repro.name}.json").is_file()


@pytest.mark.slow
def test_compare_records_names_the_first_divergent_step_and_field(replicate_groups, tmp_path):
    _, groups = replicate_groups
    original = Path(groups["native"]["runs"][0]["run_dir"]) / "metrics.jsonl"
    lines = original.read_text().splitlines()
    changed = []
    for line in lines:
        rec = json.loads(line)
        if rec["step"] == 1 and rec["kind"] == "step":
            rec["payload"]["train/train_rollout_logprob_abs_diff"] += 1e-12
        changed.append(json.dumps(rec))
    copy = tmp_path / "metrics.jsonl"
    copy.write_text("\n".join(changed) + "\n")
    result = compare_records(original, copy)
    assert result["reproduced"] is False
    d = result["first_divergence"]
    assert (d["step"], d["record"], d["field"]) == (1, "step", "train/train_rollout_logprob_abs_diff")
    assert compare_records(original, original)["reproduced"] is True


def _documented_replicates_lines():
    """The `kit analyze replicates` example of docs/analysis.md §9 and of the command's --help."""
    from click.testing import CliRunner

    from kit.cli import cli

    docs = (Path(__file__).resolve().parents[2] / "docs" / "analysis.md").read_text()
    helps = CliRunner().invoke(cli, ["analyze", "replicates", "--help"]).output
    lines = [ln.strip() for text in (docs, helps) for ln in text.splitlines()
             if ln.strip().startswith("kit analyze replicates .workspace/groups/")]
    assert len(lines) >= 2, "the docs and the --help each show the groups example"
    return lines


@pytest.mark.slow
def test_the_documented_group_globs_match_one_group_of_each_mode(replicate_groups, tmp_path):
    import glob
    import shlex

    ws, groups = replicate_groups
    for n, line in enumerate(_documented_replicates_lines()):
        args = shlex.split(line)[1:]
        patterns = [a for a in args if a.startswith(".workspace/groups/")]
        expanded = {p: sorted(glob.glob(str(ws) + p[len(".workspace"):])) for p in patterns}
        # as a shell expands them: each glob names exactly one group, native first and consistency second
        assert [[Path(m).stem for m in found] for found in expanded.values()] == \
               [[groups["native"]["group"]], [groups["consistency"]["group"]]], (line, expanded)
        rest = [a for a in args if not a.startswith(".workspace/groups/")]
        rest = [str(tmp_path / f"noise{n}") if a == "report/noise" else a for a in rest]
        files = [m for found in expanded.values() for m in found]
        proc = kit(*rest[:2], *files, *rest[2:], workspace=ws)
        assert proc.returncode == 0, (line, proc.stderr[-2000:])
