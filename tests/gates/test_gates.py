"""Gates as data: one synthetic VIME log that passes every gate, and one variant failing each gate.

The same table validates smoke runs (tests/run/test_run.py) and VIME runs (here).
"""

from __future__ import annotations

import copy
import shlex

import pytest

from kit.model.catalog import Catalog
from kit.gates.engine import GATE_SET_VERSION, GATES, evaluate
from kit.gates.rules import RunEvidence, is_command_echo
from kit.run.plan import resolve_plan

STEPS = 3


@pytest.fixture(scope="module")
def strict_arm():
    arm = Catalog.default().arm("consistency")
    doc = copy.deepcopy(arm.document)
    doc["workload"]["rollouts"] = STEPS
    return doc


@pytest.fixture(scope="module")
def native_arm(strict_arm):
    doc = copy.deepcopy(strict_arm)
    doc["name"] = "native-test"
    doc["operators"] = {"attention": "P/P", "ffn": "P/P", "logp": "P/P"}
    return doc


def vllm_config_echo(sizes: list[int]) -> str:
    shown = ", ".join(str(s) for s in sorted(sizes, reverse=True))   # vLLM prints them descending
    return ("(RolloutEngine pid=311, ip=10.0.0.2) INFO 12-02 10:00:01 [core.py:77] Initializing a V1 LLM engine "
            "(v0.16.0) with config: model='/inputs/model', dtype=torch.bfloat16, enforce_eager=False, seed=1234, "
            "compilation_config={'level': 0, 'cudagraph_mode': <CUDAGraphMode.FULL_DECODE_ONLY: 2>, "
            f"'cudagraph_capture_sizes': [{shown}], 'max_cudagraph_capture_size': {max(sizes, default=0)}}}")


def step_block(step: int, *, mismatch: float = 0.0, max_diff: float = 0.0, loss: str = "0.0123",
               numel: str = "100.0") -> list[str]:
    return [
        f"(RolloutManager pid=42) rollout {step}: {{'rollout/raw_reward': 0.5, 'rollout/rewards': 0.0, 'rollout/response_lengths': 120.0}}",
        f"(RolloutManager pid=42) perf {step}: {{'perf/rollout_time': 10.5, 'perf/tokens_per_gpu_per_sec': 99.0}}",
        f"(TrainActor pid=7) step {step}: {{'train/loss': {loss}, "
        f"'train/train_current_rollout_logprob_mismatch_count': {mismatch}, "
        f"'train/train_current_rollout_logprob_max_abs_diff': {max_diff}, "
        f"'train/train_rollout_logprob_abs_diff': 0.0, 'train/train_current_rollout_logprob_numel': {numel}}}",
        f"(TrainActor pid=7) perf {step}: {{'perf/step_time': 30.0, 'perf/train_time': 12.0}}",
    ]


def route_lines(case_letter: str) -> list[str]:
    side = "rl_kernel" if case_letter == "R" else "production"
    out = []
    for fw, target in (("megatron", "training"), ("vllm", "rollout")):
        for module in ("attention", "ffn", "logp"):
            out.append(f"[RL-Kernel][route] framework={fw} target={target} module={module} requested={side} "
                       f"actual=rlkernel.{module}.v1 fallback=false")
    return out


def good_log(arm: dict, *, letter="R", mismatch: float = 0.0) -> list[str]:
    lines = ["2026-12-02 10:00:00 INFO ray job driver started", vllm_config_echo(arm["graph"]["capture_sizes"])]
    lines += route_lines(letter)
    lines.append(f"rlkernel mismatch sidecar active: logp_case={arm['operators']['logp']}")
    for step in range(STEPS):
        lines += step_block(step, mismatch=mismatch, max_diff=0.25 if mismatch else 0.0)
    return lines


def failed_gates(arm, lines, status="SUCCEEDED", readbacks=()) -> list[str]:
    report = evaluate(RunEvidence(arm=arm, job_status=status, engine_lines=lines, readbacks=tuple(readbacks)), run_id="t")
    return [g["id"] for g in report["gates"] if g["status"] == "failed"]


def test_good_vime_log_passes_every_applicable_gate(strict_arm):
    report = evaluate(RunEvidence(arm=strict_arm, job_status="SUCCEEDED", engine_lines=good_log(strict_arm)), run_id="t")
    assert report["passed"], report
    assert report["gate_set_version"] == GATE_SET_VERSION
    statuses = {g["id"]: g["status"] for g in report["gates"]}
    assert statuses["cuda-graph-engine"] == "passed"
    assert statuses["rr-bitwise-zero"] == "passed"
    assert statuses["operator-routes"] == "passed"
    assert statuses["operator-readbacks"] == "not_applicable"
    assert report["summary"]["steps_observed"] == STEPS
    from kit.model.documents import schema_problems
    assert schema_problems(report, "validation-report") == []


def test_every_gate_has_unique_id_and_message():
    ids = [g.id for g in GATES]
    assert len(ids) == len(set(ids))
    assert all(g.message for g in GATES)


def test_job_status_gate(strict_arm):
    assert failed_gates(strict_arm, good_log(strict_arm), status="FAILED") == ["job-succeeded"]
    assert failed_gates(strict_arm, good_log(strict_arm), status="") == ["job-succeeded"]


def test_missing_step_fails(strict_arm):
    lines = [l for l in good_log(strict_arm) if " step 1:" not in l]
    assert failed_gates(strict_arm, lines) == ["steps-once"]


def test_extra_step_fails(strict_arm):
    lines = good_log(strict_arm) + step_block(STEPS)
    assert failed_gates(strict_arm, lines) == ["steps-once"]


def gate_problems(arm, lines, gate_id) -> list[str]:
    report = evaluate(RunEvidence(arm=arm, job_status="SUCCEEDED", engine_lines=lines), run_id="t")
    return next(g["problems"] for g in report["gates"] if g["id"] == gate_id)


def test_a_repeated_step_fails_naming_the_step_and_both_lines(strict_arm):
    lines = good_log(strict_arm)
    first = next(n for n, l in enumerate(lines, start=1) if " step 1: " in l)
    repeated = lines + [lines[first - 1]]                         # the same `step 1:` line printed again
    assert failed_gates(strict_arm, repeated) == ["steps-once"]
    assert gate_problems(strict_arm, repeated, "steps-once") == [
        f"step 1: the step record appears 2 times, on job log lines {first} and {len(repeated)}; "
        "each step's records are printed once"]
    # a repeated perf line is a second record of its step too, named by its side
    perf = next(n for n, l in enumerate(lines, start=1) if "TrainActor" in l and " perf 2: " in l)
    assert gate_problems(strict_arm, lines + [lines[perf - 1]], "steps-once") == [
        f"step 2: the perf (train side) record appears 2 times, on job log lines {perf} and {len(lines) + 1}; "
        "each step's records are printed once"]
    # a conflicting repeat still fails as two runs in one log
    assert "steps-once" in failed_gates(strict_arm, lines + step_block(1, loss="0.5"))


def test_rr_nonzero_mismatch_fails_and_pp_does_not_gate_it(strict_arm, native_arm):
    lines = good_log(strict_arm)
    bad = lines[:-4] + step_block(STEPS - 1, mismatch=3.0, max_diff=0.1)
    assert failed_gates(strict_arm, bad) == ["rr-bitwise-zero"]
    assert failed_gates(native_arm, good_log(native_arm, letter="P", mismatch=12.5)) == []


@pytest.mark.parametrize("numel, shown", [("0.0", "= 0.0"), ("0", "= 0"), ("-3.0", "= -3.0"), ("nan", "= nan"),
                                          ("inf", "= inf"), ("'100'", "= '100'"), ("True", "= True"),
                                          (None, "is missing")])
def test_rr_gate_needs_compared_tokens(strict_arm, native_arm, numel, shown):
    # zero mismatches over zero compared tokens proves nothing: the gate needs numel > 0 on every step
    key = "train/train_current_rollout_logprob_numel"
    lines = good_log(strict_arm)[:-4] + step_block(STEPS - 1, numel=numel or "1.0")
    if numel is None:
        lines = [l.replace(f", '{key}': 1.0", "") for l in lines]
    problems = gate_problems(strict_arm, lines, "rr-bitwise-zero")
    assert len(problems) == 1 and problems[0].startswith(f"step {STEPS - 1}: {key} {shown}"), problems
    assert "rr-bitwise-zero" in failed_gates(strict_arm, lines)


def test_rr_gate_fails_when_every_step_compared_nothing(strict_arm, native_arm):
    lines = [l.replace("'train/train_current_rollout_logprob_numel': 100.0", "'train/train_current_rollout_logprob_numel': 0")
             for l in good_log(strict_arm)]
    report = evaluate(RunEvidence(arm=strict_arm, job_status="SUCCEEDED", engine_lines=lines), run_id="t")
    assert not report["passed"]
    assert [g["id"] for g in report["gates"] if g["status"] == "failed"] == ["rr-bitwise-zero"]
    assert len(gate_problems(strict_arm, lines, "rr-bitwise-zero")) == STEPS
    # P/P arms are not judged by it
    native = [l.replace("'train/train_current_rollout_logprob_numel': 100.0", "'train/train_current_rollout_logprob_numel': 0")
              for l in good_log(native_arm, letter="P", mismatch=12.5)]
    assert failed_gates(native_arm, native) == []


def test_nonfinite_metric_fails(strict_arm):
    lines = good_log(strict_arm)[:-4] + step_block(STEPS - 1, loss="nan")
    assert failed_gates(strict_arm, lines) == ["finite-metrics"]


@pytest.mark.parametrize("line, gate", [
    ("Traceback (most recent call last):", "no-traceback"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "no-oom"),
    ("[RL-Kernel] linear_logp provider unavailable fallback=True", "no-fallback"),
])
def test_text_gates(strict_arm, line, gate):
    assert failed_gates(strict_arm, good_log(strict_arm) + [line]) == [gate]


def test_cuda_graph_evidence_only_from_the_engine(strict_arm):
    plan = resolve_plan(Catalog.default().arm("consistency"), run_id="g", rollouts=STEPS)
    argv = plan["command"]["argv"]
    echoes = [
        shlex.join(argv),                                             # a shell echo of the command
        f"Running entrypoint: {argv!r}",                              # a Python repr of argv
        "[RL-Kernel] required vLLM full-decode CUDA Graph capture sizes: [1,2,3,4]",   # the launcher's marker
    ]
    assert all(is_command_echo(e) for e in echoes)
    without_engine = [l for l in good_log(strict_arm) if "Initializing a V1 LLM engine" not in l]
    assert failed_gates(strict_arm, without_engine + echoes) == ["cuda-graph-engine"]
    # the engine line alone passes; with different capture sizes it fails
    assert failed_gates(strict_arm, without_engine + [vllm_config_echo(strict_arm["graph"]["capture_sizes"])]) == []
    assert failed_gates(strict_arm, without_engine + [vllm_config_echo([1, 2])]) == ["cuda-graph-engine"]
    eager = vllm_config_echo(strict_arm["graph"]["capture_sizes"]).replace("enforce_eager=False", "enforce_eager=True")
    assert failed_gates(strict_arm, without_engine + [eager]) == ["cuda-graph-engine"]


def test_route_on_the_wrong_side_fails(strict_arm):
    lines = [l.replace("module=ffn requested=rl_kernel", "module=ffn requested=production") for l in good_log(strict_arm)]
    assert failed_gates(strict_arm, lines) == ["operator-routes"]


def _readback(framework, target, side, case, calls=3):
    ops = {m: {"framework": framework, "target": target, "module": m, "case_id": case, "implementation": side,
               "backend_id": f"rlkernel.{m}.v1" if side == "rl_kernel" else f"vime.{m}", "call_count": calls,
               "execution_mode": "eager", "provenance": {"fallback": False}} for m in ("attention", "ffn", "logp")}
    return {"framework": framework, "target": target, "installed_hooks": ["attention", "ffn", "logp"], "fallbacks": [],
            "operators": ops}


def test_readbacks_checked_when_written(strict_arm):
    good = [("megatron-training-1.json", _readback("megatron", "training", "rl_kernel", "R/R")),
            ("vllm-rollout-2.json", _readback("vllm", "rollout", "rl_kernel", "R/R"))]
    assert failed_gates(strict_arm, good_log(strict_arm), readbacks=good) == []
    wrong = [good[0], ("vllm-rollout-2.json", _readback("vllm", "rollout", "production", "R/R"))]
    assert failed_gates(strict_arm, good_log(strict_arm), readbacks=wrong) == ["operator-readbacks"]
    missing = [good[0]]
    assert failed_gates(strict_arm, good_log(strict_arm), readbacks=missing) == ["operator-readbacks"]
    uncalled = [good[0], ("vllm-rollout-2.json", _readback("vllm", "rollout", "rl_kernel", "R/R", calls=0))]
    assert failed_gates(strict_arm, good_log(strict_arm), readbacks=uncalled) == ["operator-readbacks"]


def test_smoke_arm_needs_route_lines():
    arm = copy.deepcopy(Catalog.default().arm("smoke").document)
    arm["workload"]["rollouts"] = STEPS
    lines = [l for l in good_log(arm) if "[RL-Kernel][route]" not in l]
    assert "operator-routes" in failed_gates(arm, lines)


# --- mismatch figures: counts, not per-sample means ---------------------------------------------------

def test_summary_reports_mismatch_counts_mean_times_global_batch_size(native_arm):
    # the published G10 step 0: per-sample mean 3599.125 over a global batch of 8 is 28793 tokens (reference §4.1)
    lines = [line.replace("'train/loss'", "'train/global_batch_size': 8, 'train/loss'") if " step " in f" {line}" else line
             for line in good_log(native_arm, letter="P", mismatch=3599.125)]
    summary = evaluate(RunEvidence(arm=native_arm, job_status="SUCCEEDED", engine_lines=lines), run_id="t")["summary"]
    assert summary["mismatch_count_last"] == 28793
    assert summary["mismatch_count_total"] == 28793 * STEPS


def test_summary_falls_back_to_the_arms_global_batch_size(native_arm):
    gbs = native_arm["workload"]["global_batch_size"]
    report = evaluate(RunEvidence(arm=native_arm, job_status="SUCCEEDED",
                                  engine_lines=good_log(native_arm, letter="P", mismatch=12.5)), run_id="t")
    assert report["summary"]["mismatch_count_last"] == pytest.approx(12.5 * gbs)
    assert report["summary"]["mismatch_count_total"] == pytest.approx(12.5 * gbs * STEPS)
    from kit.model.documents import schema_problems
    assert schema_problems(report, "validation-report") == []


def test_summary_of_a_run_without_mismatch_records(strict_arm):
    lines = [line for line in good_log(strict_arm) if "TrainActor" not in line]
    summary = evaluate(RunEvidence(arm=strict_arm, job_status="SUCCEEDED", engine_lines=lines), run_id="t")["summary"]
    assert summary["mismatch_count_total"] is None and summary["mismatch_count_last"] is None


def test_progress_display_shows_the_count(native_arm):
    import io

    from kit.run.logs import Progress
    from kit.engines.vime.records import parse_records

    out = io.StringIO()
    bar = Progress(STEPS, out, native_arm)
    lines = [line.replace("'train/loss'", "'train/global_batch_size': 8, 'train/loss'")
             for line in good_log(native_arm, letter="P", mismatch=3599.125)]
    for rec in parse_records(lines):
        bar.record(rec)
    shown = out.getvalue().strip().splitlines()
    assert shown[-1].startswith(f"step {STEPS}/{STEPS}") and shown[-1].endswith("last step mismatched 28793 tokens")
    assert "3599.125" not in out.getvalue()
