"""Property-based fuzzing of `kit analyze` (perf, convergence, replicates) over a real sealed smoke run whose
log records and manifest fields hold 1e308, inf, NaN, huge integers and values of junk types: every case
ends in a report (exit 0/1) or one line naming the file and what is wrong (exit 2), never a traceback or
a hang."""

from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given, strategies as st

from kit.cli import cli
from kit.evidence import bundle as E

from sealed_run import kit
from test_fuzz_readers import fuzz, json_value, no_hang

SUBCOMMANDS = {"perf": ["--steady-from", "0", "--draws", "100", "--no-figures"],
               "convergence": ["--no-figures"], "replicates": ["--draws", "100"]}
# literals a VIME log holds in a record's dict; the reader takes Python literals, nan and inf
LOG_VALUES = ["1e308", "-1e308", "1e309", "inf", "-inf", "nan", "10**400", "1" + "0" * 400, "None", "True", "'x'",
              "[1, 2]", "{'a': 1}", "(1,)", "{1, 2}", "b'x'", "1j", "''", "0", "-0.0", "5e-324", "float('nan')"]
JUNK = [1e308, -1e308, 2 ** 70, -(2 ** 70), 0, -1, 0.5, None, True, False, "x", "", [], [1], {}, {"a": 1}]
MANIFEST_FIELDS = ["run_id", "kit_version", "arm", "arm/name", "arm/workload", "arm/workload/rollouts",
                   "arm/workload/seed", "arm/workload/rollout_seed", "arm/workload/global_batch_size",
                   "arm/workload/max_response_len", "arm/topology", "arm/engine", "stack", "stack/sha256",
                   "runtime", "inputs", "environment", "ray_cluster", "gpus", "host", "image"]


@pytest.fixture(scope="module")
def analyzed_run(tmp_path_factory) -> Path:
    """A real sealed smoke run of three rollouts, made writable so each case can edit a copy."""
    ws = tmp_path_factory.mktemp("analyze-ws")
    proc = kit("run", "--arm", "smoke", "--rollouts", "3", "--run-id", "fuzz-src", "--allow-dirty",
               env={"KIT_WORKSPACE": str(ws)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = ws / E.RUNS_DIR / "fuzz-src"
    for path in [run_dir, *run_dir.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWUSR)
    return run_dir


def _copy(src: Path, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("case") / "runs" / src.name
    shutil.copytree(src, dst)
    return dst


def _analyze(sub: str, run_dir: Path, out: Path) -> None:
    with no_hang(60):
        result = CliRunner().invoke(cli, ["analyze", sub, str(run_dir), "--out", str(out), *SUBCOMMANDS[sub]])
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{type(exc).__name__}: {exc}\n{result.output[-2000:]}"
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("kit: ") and (str(run_dir) in last or "--" in last), result.stderr


@fuzz(220)
@given(sub=st.sampled_from(sorted(SUBCOMMANDS)), kind=st.sampled_from(["step", "perf", "rollout"]),
       line=st.integers(0, 2), value=st.sampled_from(LOG_VALUES), key=st.integers(0, 40))
def test_analyze_log_records_with_extreme_and_junk_values(analyzed_run, tmp_path_factory, sub, kind, line, value, key):
    run_dir = _copy(analyzed_run, tmp_path_factory)
    log = run_dir / E.RUN_LOG
    lines = log.read_text().splitlines(keepends=True)
    hits = [i for i, text in enumerate(lines) if text.startswith(f"{kind} ")]
    i = hits[line % len(hits)]
    entries = re.findall(r"'[^']+': [^,}]+", lines[i])
    target = entries[key % len(entries)]
    lines[i] = lines[i].replace(target, target.split(": ")[0] + ": " + value, 1)
    log.write_text("".join(lines))
    _analyze(sub, run_dir, tmp_path_factory.mktemp("out"))


def _set(doc: dict, pointer: str, value, drop: bool) -> None:
    parts = pointer.split("/")
    holder = doc
    for part in parts[:-1]:
        holder = holder[part] if isinstance(holder.get(part), dict) else holder.setdefault(part, {})
        if not isinstance(holder, dict):
            return
    if drop:
        holder.pop(parts[-1], None)
    else:
        holder[parts[-1]] = value


@fuzz(220)
# a find: a seed of True passed Python's int checks and was written into a replicates.json its schema refuses
@example(sub="replicates", field="arm/workload/seed", value=True, drop=False, raw=None)
@example(sub="replicates", field="arm/workload/rollout_seed", value=False, drop=False, raw=None)
@given(sub=st.sampled_from(sorted(SUBCOMMANDS)), field=st.sampled_from(MANIFEST_FIELDS),
       value=st.one_of(st.sampled_from(JUNK), json_value), drop=st.booleans(), raw=st.sampled_from(
           [None, b"", b"{", b"[]", b"1e400", b'{"run_id": NaN}', b'{"x": Infinity}', b"\xff", b"[" * 100 + b"]" * 100]))
def test_analyze_manifests_with_extreme_and_junk_fields(analyzed_run, tmp_path_factory, sub, field, value, drop, raw):
    run_dir = _copy(analyzed_run, tmp_path_factory)
    path = run_dir / E.MANIFEST
    if raw is not None and field == "run_id":      # now and then the whole file is not a document
        path.write_bytes(raw)
    else:
        doc = json.loads(path.read_text())
        _set(doc, field, value, drop)
        path.write_text(json.dumps(doc))
    _analyze(sub, run_dir, tmp_path_factory.mktemp("out"))


@fuzz(60)
@given(args=st.lists(st.sampled_from(["--steady-from", "-1", "1e308", "nan", "--draws", "0", "99", "inf", "--seed",
                                      "--gpus", "--global-batch-size", "--name", "", "x", "--paired", "--unpaired",
                                      "--bootstrap", "nope", "--length-lines", "--phase", "--out"]), max_size=6))
def test_analyze_cli_flags_are_a_report_or_one_line(analyzed_run, tmp_path_factory, args):
    out = tmp_path_factory.mktemp("out")
    runner = CliRunner()
    for sub in ("perf", "convergence"):
        with no_hang(60), runner.isolated_filesystem(temp_dir=out):     # a fuzzed "--out x" stays in tmp
            result = runner.invoke(cli, ["analyze", sub, str(analyzed_run), "--out", str(out / sub),
                                              "--no-figures", *args])
        exc = result.exception
        assert exc is None or isinstance(exc, SystemExit), f"{type(exc).__name__}: {exc}"
        assert result.exit_code in (0, 1, 2)
