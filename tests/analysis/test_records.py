"""The one reader of VIME records: per-step slots, duplicates, conflicts, prefixes, ANSI, tqdm, batch size."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from fixtures_vime_logs import synthetic_rows, write_log
from kit.analysis.table import load_arm
from kit.model.errors import BadInput
from kit.engines.vime.records import RecordConflict, collect_steps, generation_progress_seconds, parse_records


def steps_of(lines):
    return collect_steps(parse_records(lines))


def test_two_perf_lines_are_told_apart_by_their_keys():
    steps = steps_of([
        "(RolloutManager pid=1) perf 0: {'perf/rollout_time': 3.0, 'perf/tokens_per_gpu_per_sec': 10.0}",
        "\x1b[36m(Train pid=2)\x1b[0m perf 0: {'perf/step_time': 9.0, 'perf/train_time': 4.0}",
    ])
    assert steps[0].payloads["perf_rollout"] == {"perf/rollout_time": 3.0, "perf/tokens_per_gpu_per_sec": 10.0}
    assert steps[0].payloads["perf_train"] == {"perf/step_time": 9.0, "perf/train_time": 4.0}
    assert steps[0].value("perf/step_time") == 9.0 and steps[0].value("perf/rollout_time") == 3.0


def test_identical_repeats_collapse_even_with_nan():
    line = "step 2: {'train/loss': nan, 'train/grad_norm': inf}"
    steps = steps_of([line, "(pid=3) " + line])
    assert list(steps) == [2] and steps[2].line_numbers == {"train": 1}


def test_conflicting_repeats_name_both_line_numbers():
    with pytest.raises(RecordConflict, match=r"lines 1 and 3: two different step records for step 0"):
        steps_of(["step 0: {'train/loss': 1.0}", "noise", "step 0: {'train/loss': 2.0}"])


def test_conflicting_perf_sides_are_named():
    with pytest.raises(RecordConflict, match=r"lines 1 and 2: .*perf \(train side\)"):
        steps_of(["perf 0: {'perf/step_time': 1.0}", "perf 0: {'perf/step_time': 1.5}"])


@pytest.mark.parametrize("payload,which", [("{'perf/x': 1}", "neither"),
                                           ("{'perf/step_time': 1, 'perf/rollout_time': 2}", "both")])
def test_unplaceable_perf_line_is_an_error(payload, which):
    with pytest.raises(RecordConflict, match=f"line 1: perf 0 holds {which}"):
        steps_of([f"perf 0: {payload}"])


def test_steps_are_the_union_over_record_kinds():
    steps = steps_of(["rollout 0: {'rollout/raw_reward': 1.0}", "step 1: {'train/loss': 0.5}"])
    assert list(steps) == [0, 1]
    assert steps[0].value("train/loss") is None


def test_tqdm_bars_are_read_when_present():
    bar = "(R pid=1) Rollout generation: 100%|██| 8/8 [01:06<00:00,  0.12it/s]"
    assert generation_progress_seconds([bar, "Rollout generation:  50%|█ | 4/8 [00:30<00:30]", bar]) == [66, 66]


def test_bare_log_needs_no_tqdm_and_takes_its_stem_as_name(tmp_path):
    log = write_log(tmp_path / "native-a.log", synthetic_rows(5), with_tqdm=False)
    arm = load_arm(log)
    assert (arm.name, arm.is_bare_log, arm.progress_seconds, arm.step_indices) == ("native-a", True, None, tuple(range(5)))


def test_tqdm_pairs_give_one_progress_time_per_step(tmp_path):
    arm = load_arm(write_log(tmp_path / "a.log", synthetic_rows(4), with_tqdm=True))
    assert arm.progress_seconds is not None and len(arm.progress_seconds) == 4


def test_name_override(tmp_path):
    assert load_arm(write_log(tmp_path / "a.log", synthetic_rows(2)), name="strict").name == "strict"


def test_bad_name_is_refused(tmp_path):
    with pytest.raises(BadInput, match="arm name 'a b'"):
        load_arm(write_log(tmp_path / "a.log", synthetic_rows(2)), name="a b")


def test_run_dir_takes_name_and_batch_size_from_the_manifest(tmp_path):
    run = tmp_path / "run-7"
    run.mkdir()
    write_log(run / "run.log", synthetic_rows(3), gbs=4)
    (run / "manifest.json").write_text(json.dumps(
        {"run_id": "run-7", "arm": {"name": "consistency", "workload": {"global_batch_size": 4, "max_response_len": 256}}}))
    arm = load_arm(run)
    assert (arm.name, arm.global_batch_size, arm.global_batch_size_origin, arm.max_response_len) == \
        ("consistency", 4, "manifest workload.global_batch_size", 256)


def test_manifest_and_log_disagreeing_on_batch_size_is_an_error(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    write_log(run / "run.log", synthetic_rows(3), gbs=8)
    (run / "manifest.json").write_text(json.dumps({"arm": {"name": "x", "workload": {"global_batch_size": 16}}}))
    with pytest.raises(BadInput, match="global_batch_size=16.*train/global_batch_size=8"):
        load_arm(run)


def test_unknown_batch_size_is_an_error_naming_the_flag(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("step 0: {'train/loss': 1.0}\nperf 0: {'perf/step_time': 2.0}\n")
    with pytest.raises(BadInput, match="--global-batch-size"):
        load_arm(log)
    assert load_arm(log, global_batch_size=3).global_batch_size == 3


@pytest.mark.parametrize("setup,message", [
    (lambda p: None, "no such file or directory"),
    (lambda p: p.mkdir(), "must hold run.log"),
    (lambda p: p.write_text("hello\nworld\n"), "no VIME records"),
])
def test_unusable_inputs_are_bad_input(tmp_path, setup, message):
    target = tmp_path / "thing"
    setup(target)
    with pytest.raises(BadInput, match=message):
        load_arm(target)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80), max_size=20))
def test_arbitrary_text_never_crashes_the_reader(lines):
    # anything that is not a well-formed record line is skipped, or a placement error is raised
    try:
        steps_of([f"step 0: {l}" for l in lines] + lines)
    except RecordConflict:
        pass


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["train/loss", "train/grad_norm", "train/ppo_kl"]),
                       st.floats(allow_nan=True, allow_infinity=True), min_size=1))
def test_python_repr_round_trips(payload):
    steps = steps_of([f"\x1b[32m(Train pid=9)\x1b[0m step 5: {payload!r}"])
    got = steps[5].payloads["train"]
    assert got.keys() == payload.keys()
    for k, v in payload.items():
        assert (got[k] != got[k] and v != v) or got[k] == v


# --- unparseable record lines are reported, never dropped silently -----------------------------------

def test_unparseable_record_lines_are_collected_with_their_line_numbers():
    bad = []
    records = list(parse_records([
        "step 0: {'train/loss': 1.0}",
        "(Train pid=2) perf 0: {'perf/step_time': oops}",        # a name: not a literal
        "noise",
        "step 1: {'train/loss': [}",                              # syntax error
        "rollout 2: {'rollout/raw_reward': 0.5, 'rollout/x",     # cut before its closing brace
        "step 3: {1, 2}",                                         # a set, not a dict
    ], bad))
    assert [r.step for r in records] == [0]
    assert [(u.line_number, u.kind, u.step) for u in bad] == [(2, "perf", 0), (4, "step", 1), (5, "rollout", 2),
                                                               (6, "step", 3)]
    assert "syntax error" in bad[1].reason and "closing brace" in bad[2].reason
    assert bad[0].describe("run.log").startswith("run.log:2: perf 0 record does not parse")
    # without a list the reader behaves as before: the lines are skipped
    assert len(list(parse_records(["step 1: {'a': [}"]))) == 0


def test_unparseable_lines_become_arm_notes(tmp_path):
    log = write_log(tmp_path / "a.log", synthetic_rows(3))
    with open(log, "a") as fh:
        fh.write("perf 9: {'perf/step_time': nope}\n")
    arm = load_arm(log)
    n = len(log.read_text().splitlines())
    assert [u.line_number for u in arm.unparseable] == [n]
    assert any("1 record line(s)" in note and f"line {n}" in note for note in arm.notes)
    assert arm.unparseable_messages() == [(f"{log}:{n}: perf 9 record does not parse "
                                           "(not a literal: names or calls other than inf/nan); skipped")]


def test_a_log_whose_every_record_line_is_unparseable_is_bad_input(tmp_path):
    log = tmp_path / "broken.log"
    log.write_text("header\nstep 0: {'train/loss': ?}\nperf 0: {'perf/step_time': (}\n")
    with pytest.raises(BadInput, match=r"broken.log: every record line is unparseable \(2 line\(s\): 2, 3;"):
        load_arm(log)


def test_cli_warns_and_writes_notes(tmp_path):
    from click.testing import CliRunner

    from kit.cli import cli

    log = write_log(tmp_path / "a.log", synthetic_rows(4))
    with open(log, "a") as fh:
        fh.write("step 7: {'train/loss': [}\n")
    n = len(log.read_text().splitlines())
    for sub in ("perf", "convergence"):
        out = tmp_path / sub
        result = CliRunner().invoke(cli, ["analyze", sub, str(log), "--out", str(out), "--no-figures"])
        assert result.exit_code == 0, result.output + result.stderr
        assert f"kit: warning: {log}:{n}: step 7 record does not parse" in result.stderr
        notes = (out / "notes.txt").read_text()
        assert f"{log}:{n}: step 7 record does not parse" in notes
    summary = json.loads((tmp_path / "perf" / "summary.json").read_text())
    assert any(f"line {n}" in note for note in summary["arms"][0]["notes"])

    broken = tmp_path / "broken.log"
    broken.write_text("step 0: {'train/loss': ?}\n")
    result = CliRunner().invoke(cli, ["analyze", "perf", str(broken), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "every record line is unparseable" in result.stderr
    assert not (tmp_path / "x").exists()
