"""Write VIME-format logs for tests: from the published G10/G11 per-step table, or synthetic steps.

The logs carry what a real VIME/Ray log carries: Ray actor prefixes, ANSI colour escapes in some
lines, unrelated chatter, tqdm generation bars, repeated identical lines, and per step one
``rollout N:``, one ``step N:`` and two ``perf N:`` lines (rollout side and train side).
Mismatch and compared-token counts are printed as VIME prints them: per-sample means, i.e. the
published step totals divided by the global batch size. Example::

    paths = write_published_logs(tmp_path)      # {"G10": .../G10.log, "G11": .../G11.log}
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

DATA = Path(__file__).parent / "data" / "g10-g11-cuda-200"
GLOBAL_BATCH_SIZE = 8  # the published workload: 1 prompt x 8 samples
ANSI_CYAN, ANSI_RESET = "\x1b[36m", "\x1b[0m"


def published_rounds() -> dict[str, list[dict]]:
    """rounds.csv by group, values as floats where numeric."""
    groups: dict[str, list[dict]] = {}
    with open(DATA / "rounds.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            groups.setdefault(row["group"], []).append(row)
    return groups


def published_summary() -> dict[str, dict]:
    doc = json.loads((DATA / "summary.json").read_text())
    return {s["group"]: s for s in doc["summaries"]}


def _prefix(actor: str, step: int, colour: bool) -> str:
    text = f"({actor} pid={4000 + step % 7}, ip=10.0.0.2)"
    return f"{ANSI_CYAN}{text}{ANSI_RESET} " if colour else f"{text} "


def _tqdm(seconds: float) -> str:
    s = int(seconds)
    return f"Rollout generation: 100%|██████████| 8/8 [{s // 60:02d}:{s % 60:02d}<00:00,  0.12it/s]"


def step_lines(row: dict, gbs: int, step: int, colour: bool, with_tqdm: bool) -> list[str]:
    """The log lines of one step from a rounds.csv-shaped row (floats)."""
    f = {k: float(v) for k, v in row.items() if k not in ("phase", "run_id", "group", "operator_case",
                                                            "framework_consistency")}
    rollout = {
        "rollout/raw_reward": f["raw_reward"], "rollout/rewards": f["reward"],
        "rollout/response_lengths": f["response_length"], "rollout/response_len/mean": f["response_length"],
        "rollout/truncated": f["truncated_ratio"], "rollout/truncated_ratio": f["truncated_ratio"],
        "rollout/kl": f["rollout_kl"],
    }
    perf_rollout = {
        "perf/rollout_time": f["rollout_time"],
        # derived (README): gbs samples over gbs GPUs -> response_length / rollout_time
        "perf/tokens_per_gpu_per_sec": f["response_length"] / f["rollout_time"],
        "rollout/truncated_ratio": f["truncated_ratio"],
    }
    train = {
        "train/loss": f["train_loss"], "train/pg_loss": f["pg_loss"], "train/pg_clipfrac": f["pg_clipfrac"],
        "train/entropy_loss": f["entropy"], "train/ppo_kl": f["ppo_kl"], "train/grad_norm": f["grad_norm"],
        "train/global_batch_size": gbs, "train/step": step,
        "train/train_rollout_logprob_abs_diff": f["mean_abs_dlogp"],
        "train/train_current_rollout_logprob_max_abs_diff": f["max_abs_dlogp"],
        "train/train_current_rollout_logprob_mismatch_count": f["mismatch_count"] / gbs,
        "train/train_current_rollout_logprob_numel": f["active_token_count"] / gbs,
    }
    perf_train = {
        "perf/step_time": f["step_time"], "perf/train_time": f["train_time"],
        "perf/train_wait_time": f["step_time"] - f["train_time"],  # derived (README)
        "perf/update_weights_time": f["update_weights_time"],
        "perf/actor_train_tok_per_s": f["actor_tokens_per_second"],
        "perf/actor_train_tflops": f["actor_train_tflops"],
    }
    lines = []
    if with_tqdm:
        bar = _tqdm(f["rollout_time"])
        lines += [_prefix("RolloutManager", step, False) + bar, _prefix("RolloutManager", step, False) + bar]
    lines.append(_prefix("RolloutManager", step, colour) + f"rollout {step}: {rollout!r}")
    lines.append(_prefix("RolloutManager", step, False) + f"perf {step}: {perf_rollout!r}")
    lines.append(f"{_prefix('MegatronTrainRayActor', step, colour)}{ANSI_CYAN}step {step}: {train!r}{ANSI_RESET}")
    lines.append(_prefix("MegatronTrainRayActor", step, False) + f"perf {step}: {perf_train!r}")
    if step % 50 == 3:
        lines.append(lines[-2])  # Ray re-prints a line now and then: identical repeats are legal
    lines.append(_prefix("MegatronTrainRayActor", step, False) + f"[INFO] step {step} finished in {f['step_time']:.1f}s")
    return lines


def write_log(path: Path, rows: list[dict], gbs: int = GLOBAL_BATCH_SIZE, with_tqdm: bool = True) -> Path:
    lines = ["2026-09-01 10:00:00,000 INFO worker.py:1 -- Connecting to existing Ray cluster at 10.0.0.2:6379",
             "Job submission server address: http://127.0.0.1:8265"]
    for row in rows:
        step = int(row["step"])
        lines += step_lines(row, gbs, step, colour=step % 3 == 0, with_tqdm=with_tqdm)
    lines.append("------------------------------------------")
    lines.append("Job 'vime200-run' succeeded")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_published_logs(directory: Path) -> dict[str, Path]:
    """``G10.log`` and ``G11.log`` (bare logs; arm name = file stem) from the published rounds.csv."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for group, rows in published_rounds().items():
        # one arm with tqdm bars, one without: bars are optional
        out[group] = write_log(directory / f"{group}.log", rows, with_tqdm=group == "G10")
    return out


def synthetic_rows(n_steps: int, *, seed: int = 0, slowdown: float = 1.0, max_len: int = 256,
                   mismatch: bool = True) -> list[dict]:
    """Deterministic rounds.csv-shaped rows for a small run (the smoke workload's scale)."""
    import random

    rng = random.Random(seed)
    rows = []
    for step in range(n_steps):
        length = float(rng.choice([max_len, rng.randint(max_len // 4, max_len - 1)]))
        trunc = 1.0 if length == max_len else rng.choice([0.0, 0.25, 0.5])
        rollout = (0.004 * length + 0.2 + rng.random() * 0.05) * slowdown
        train = (0.002 * length + 0.1) * slowdown
        update = 0.05 + rng.random() * 0.01
        step_time = rollout + update + 0.03 + train
        tokens = length * 8
        rows.append({
            "step": step, "reward": 0.0, "raw_reward": rng.choice([0.0, 0.25, 0.5, 0.75]),
            "response_length": length, "truncated_ratio": trunc, "rollout_kl": 0.0,
            "train_loss": rng.random() * 1e-3, "pg_loss": rng.random() * 1e-3, "pg_clipfrac": rng.random() * 0.01,
            "entropy": 0.3, "ppo_kl": 0.0 if not mismatch else rng.random() * 1e-3, "grad_norm": rng.random(),
            "mean_abs_dlogp": rng.random() * 0.02 if mismatch else 0.0,
            "max_abs_dlogp": rng.random() if mismatch else 0.0,
            "mismatch_count": float(rng.randint(0, int(tokens))) if mismatch else 0.0,
            "active_token_count": tokens, "rollout_time": rollout, "train_time": train, "step_time": step_time,
            "update_weights_time": update, "actor_tokens_per_second": tokens / train,
            "actor_train_tflops": 1.0,
        })
    return rows
