"""The checks behind the gates, by rule kind, and the conditions under which a gate applies.

Which gates a run is judged by, with what parameters, is data: ``kit/gates/sets/*.json``, applied
by :mod:`kit.gates.engine`. Here each rule kind is a function ``(evidence, parameters) -> problems``.
Text rules read only the engine's own output (the job log lines), never lines the kit wrote (its
header, the echoed command), and CUDA-graph evidence is taken only from the engine's configuration
echo, never from the launcher's marker or the command line, which carry the same strings whether or
not vLLM captured a graph (reference §12 item 6). Example::

    evidence = RunEvidence(arm=arm_doc, job_status="SUCCEEDED", engine_lines=log_lines)
    RULES["log-absent"](evidence, {"text": "Traceback", "max_hits": 10})     # [] when absent
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable

from kit.engines.vime import keys
from kit.engines.vime.records import ANSI_RE, Record, RecordConflict, collect_steps, parse_records
from kit.model.engine_traits import traits


MISMATCH_KEY = keys.MISMATCH_COUNT
MAX_DIFF_KEY = keys.MAX_ABS_DIFF
MEAN_DIFF_KEY = keys.MEAN_ABS_DIFF
NUMEL_KEY = keys.NUMEL
MODULES = ("attention", "ffn", "logp")
SIDES = (("megatron", "training", 0), ("vllm", "rollout", 1))   # framework, target, index of the case letter
SMOKE_MODEL_RE = re.compile(r"smoke model \S+: config_sha256=([0-9a-f]{64}) weights_sha256=([0-9a-f]{64})")

ROUTE_RE = re.compile(r"\[RL-Kernel\]\[route\]\s+framework=(\S+)\s+target=(\S+)\s+module=(\S+)\s+"
                      r"requested=(\S+)\s+actual=(\S+)\s+fallback=(\S+)")
# vLLM's config echo: ``cudagraph_mode=<CUDAGraphMode.FULL_DECODE_ONLY: 2>`` or
# ``'cudagraph_mode': <CUDAGraphMode.FULL_DECODE_ONLY: 2>``. The command line's compact JSON
# (``"cudagraph_mode":"FULL_DECODE_ONLY"``) quotes the value, so it does not match.
ENGINE_GRAPH_MODE_RE = re.compile(r"cudagraph_mode'?\s*[:=]\s*<?(?:CUDAGraphMode\.)?FULL_DECODE_ONLY\b")
ENGINE_CAPTURE_RE = re.compile(r"'cudagraph_capture_sizes':\s*\[([0-9,\s]*)\]")
# Lines that repeat what the launcher asked for, not what the engine did.
COMMAND_ECHO_MARKERS = ("--vllm-compilation-config", "full-decode CUDA Graph capture sizes")
COMMAND_ECHO_RE = re.compile(r"\btrain\.py\b.*\s--[a-z]")


@dataclass(frozen=True)
class RunEvidence:
    """What the gates read: the resolved arm, the job's terminal status, the engine's log lines
    and the operator readbacks the run wrote (``(file name, document)``)."""

    arm: dict
    job_status: str
    engine_lines: tuple[str, ...] | list[str]
    readbacks: tuple[tuple[str, dict], ...] = ()
    inputs: dict | None = None          # the manifest's input hashes, checked against what the engine reports

    @cached_property
    def lines(self) -> list[str]:
        return [ANSI_RE.sub("", line.rstrip("\n")) for line in self.engine_lines]

    @cached_property
    def records(self) -> list[Record]:
        return list(parse_records(self.lines))

    @cached_property
    def steps(self):
        """``{step: StepRecords}``, or the RecordConflict that prevented grouping."""
        try:
            return collect_steps(self.records)
        except RecordConflict as exc:
            return exc

    @property
    def expected_steps(self) -> int:
        return int(self.arm["workload"]["rollouts"])

    @property
    def all_strict(self) -> bool:
        return all(case == "R/R" for case in self.arm["operators"].values())

    @cached_property
    def routes(self) -> list[dict]:
        out = []
        for number, line in enumerate(self.lines, start=1):
            m = ROUTE_RE.search(line)
            if m:
                out.append(dict(zip(("framework", "target", "module", "requested", "actual", "fallback"), m.groups()),
                                line=number))
        return out


# --- checks -------------------------------------------------------------------------------------

def _job_status(ev: RunEvidence, p: dict) -> list[str]:
    want = p["expected"]
    return [] if ev.job_status == want else [f"job status is {ev.job_status or 'missing'}, expected {want}"]


def _train_steps(ev: RunEvidence):
    steps = ev.steps
    if isinstance(steps, RecordConflict):
        return None, [str(steps)]
    return {s: r for s, r in steps.items() if "train" in r.payloads}, []


SLOT_LABELS = {"rollout": "rollout", "train": "step", "perf_rollout": "perf (rollout side)",
               "perf_train": "perf (train side)"}


def _steps_once(ev: RunEvidence, p: dict) -> list[str]:
    train, problems = _train_steps(ev)
    if problems:
        return problems
    expected = set(range(ev.expected_steps))
    seen = set(train)
    out = []
    if expected - seen:
        out.append(f"missing step records: {_ranges(sorted(expected - seen))} (expected 0..{ev.expected_steps - 1})")
    if seen - expected:
        out.append(f"unexpected step records: {_ranges(sorted(seen - expected))} (expected 0..{ev.expected_steps - 1})")
    # An identical copy is still a second record: the job printed the step twice (a log holding a
    # rerun, a re-streamed log), so "exactly once" is not met even though the values agree.
    for step, rec in ev.steps.items():
        for slot, again in sorted(rec.repeats.items()):
            lines = [rec.line_numbers[slot], *again]
            out.append(f"step {step}: the {SLOT_LABELS[slot]} record appears {len(lines)} times, on job log lines "
                       f"{', '.join(map(str, lines[:-1]))} and {lines[-1]}; each step's records are printed once")
    return _capped(out, p["max_problems"])


def _capped(out: list[str], most: int) -> list[str]:
    return out[:most] + ([f"... and {len(out) - most} more"] if len(out) > most else [])


def _bitwise_zero(ev: RunEvidence, p: dict) -> list[str]:
    train, problems = _train_steps(ev)
    if problems:
        return problems
    out = []
    for step, rec in sorted(train.items()):
        payload = rec.payloads["train"]
        # zero mismatches over zero compared tokens proves nothing (reference §3.2 G5: numel > 0)
        numel = payload.get(NUMEL_KEY)
        if NUMEL_KEY not in payload:
            out.append(f"step {step}: {NUMEL_KEY} is missing; the gate needs the compared-token count, > 0")
        elif not _number(numel) or not math.isfinite(numel) or numel < max(p["min_numel"], 1e-300):
            out.append(f"step {step}: {NUMEL_KEY} = {numel!r}; the gate needs a finite compared-token count > 0")
        for key in (MISMATCH_KEY, MAX_DIFF_KEY):
            value = payload.get(key)
            if key not in payload:
                out.append(f"step {step}: {key} is missing")
            elif not _number(value) or not math.isfinite(value) or abs(value) > p["tolerance"]:
                need = "exactly 0" if p["tolerance"] == 0 else f"at most {p['tolerance']}"
                out.append(f"step {step}: {key} = {value!r}, an R/R arm needs {need}")
    return _capped(out, p["max_problems"])


def _finite(ev: RunEvidence, p: dict) -> list[str]:
    out = []
    for rec in ev.records:
        for key, value in _leaves(rec.payload):
            if isinstance(value, float) and not math.isfinite(value):
                out.append(f"line {rec.line_number}: {rec.kind} {rec.step} {key} is {value!r}")
    return _capped(out, p["max_problems"])


def _leaves(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{prefix}{k}" if not prefix else f"{prefix}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


@lru_cache(maxsize=64)
def _compiled(regex: str, ignore_case: bool) -> re.Pattern:
    return re.compile(regex, re.IGNORECASE if ignore_case else 0)


def _log_absent(ev: RunEvidence, p: dict) -> list[str]:
    """No job log line holds ``text`` (literally) or matches ``regex``."""
    pattern = p["text"] if "text" in p else _compiled(p["regex"], bool(p.get("ignore_case")))
    hits = []
    for number, line in enumerate(ev.lines, start=1):
        found = (pattern in line) if isinstance(pattern, str) else pattern.search(line)
        if found:
            hits.append(f"job log line {number}: {line.strip()[:200]}")
    return _capped(hits, p["max_hits"])


def is_command_echo(line: str) -> bool:
    """A line that repeats the launcher's request (command line, entrypoint marker)."""
    return any(m in line for m in COMMAND_ECHO_MARKERS) or bool(COMMAND_ECHO_RE.search(line))


def _cuda_graph(ev: RunEvidence, p: dict) -> list[str]:
    expected = sorted(ev.arm["graph"]["capture_sizes"])
    engine = [line for line in ev.lines if not is_command_echo(line)]
    mode_re = _compiled(ENGINE_GRAPH_MODE_RE.pattern.replace("FULL_DECODE_ONLY", re.escape(p["graph_mode"])), False)
    out = []
    if not any(mode_re.search(line) for line in engine):
        out.append(f"no engine configuration line shows cudagraph_mode {p['graph_mode']}")
    if not any("enforce_eager=False" in line for line in engine):
        out.append("no engine configuration line shows enforce_eager=False")
    sizes_seen = []
    for line in engine:
        for m in ENGINE_CAPTURE_RE.finditer(line):
            sizes_seen.append(sorted(int(x) for x in m.group(1).replace(" ", "").split(",") if x))
    if expected not in sizes_seen:
        shown = f"; the engine reported {sizes_seen[0]}" if sizes_seen else ""
        out.append(f"no engine configuration line shows capture sizes {expected}{shown}")
    return out


def _expected_side(case: str, index: int) -> str:
    return "rl_kernel" if case.split("/")[index] == "R" else "production"


def _routes(ev: RunEvidence, p: dict) -> list[str]:
    out = []
    by_key = {}
    for route in ev.routes:   # the side is the target (training/rollout), whatever the framework is called
        by_key.setdefault((route["target"], route["module"]), []).append(route)
    for _, target, index in SIDES:
        for module in MODULES:
            case = ev.arm["operators"][module]
            want = _expected_side(case, index)
            routes = by_key.get((target, module), [])
            if not routes:
                if traits(ev.arm["engine"]).routes_required:
                    out.append(f"no [RL-Kernel][route] line for target {target} module {module}")
                continue
            for route in routes:
                framework = route["framework"]
                if route["requested"] != want:
                    out.append(f"job log line {route['line']}: {framework}/{target} {module} requested "
                               f"{route['requested']}, the arm's case {case} needs {want}")
                if route["fallback"].lower() != "false":
                    out.append(f"job log line {route['line']}: {framework}/{target} {module} fell back")
    return out


def _readbacks(ev: RunEvidence, p: dict) -> list[str]:
    """Reference §3.2 G2 over ``readbacks/*.json``: each side installed, called and on the arm's case."""
    out = []
    for framework, target, index in SIDES:
        docs = [(name, d) for name, d in ev.readbacks if d.get("framework") == framework and d.get("target") == target]
        if not docs:
            out.append(f"missing {framework}/{target} readback")
            continue
        for name, doc in docs:
            if doc.get("fallbacks"):
                out.append(f"readbacks/{name}: fallbacks {doc['fallbacks']!r}")
        for module in MODULES:
            case = ev.arm["operators"][module]
            want = _expected_side(case, index)
            if framework == "megatron" and module == "logp" and want == "production":
                continue  # VIME's native logp installs no hook; the sidecar marker proves the path
            records = [(name, d.get("operators", {}).get(module)) for name, d in docs]
            records = [(name, r) for name, r in records if isinstance(r, dict)]
            installed = any(module in d.get("installed_hooks", []) for _, d in docs)
            calls = sum(int(r.get("call_count", 0) or 0) for _, r in records)
            if not installed:
                out.append(f"{framework}/{target} {module}: no readback lists it in installed_hooks")
            if calls <= 0:
                out.append(f"{framework}/{target} {module}: call_count is 0")
            for name, r in records:
                if r.get("implementation") != want:
                    out.append(f"readbacks/{name}: {module} implementation {r.get('implementation')!r}, expected {want!r}")
                if r.get("case_id") != case:
                    out.append(f"readbacks/{name}: {module} case_id {r.get('case_id')!r}, expected {case!r}")
                if (r.get("provenance") or {}).get("fallback") is True:
                    out.append(f"readbacks/{name}: {module} provenance.fallback is true")
                backend = str(r.get("backend_id") or "")
                if want == "rl_kernel" and not backend.startswith("rlkernel."):
                    out.append(f"readbacks/{name}: {module} backend_id {backend!r} does not start with 'rlkernel.'")
                if want == "production" and backend.startswith("rlkernel."):
                    out.append(f"readbacks/{name}: {module} is production but reports backend_id {backend!r}")
    return out


def _model_identity(ev: RunEvidence, p: dict) -> list[str]:
    model = (ev.inputs or {}).get("model") or {}
    reported = [m.groups() for m in map(SMOKE_MODEL_RE.search, ev.lines) if m]
    if not reported:
        return ["the engine printed no 'smoke model ...: config_sha256=... weights_sha256=...' line"]
    out = []
    for config_sha, weights_sha in reported:
        if config_sha != model.get("config_sha256"):
            out.append(f"engine model config_sha256 {config_sha}, the manifest records {model.get('config_sha256')}")
        if weights_sha != model.get("weights_sha256"):
            out.append(f"engine initial weights_sha256 {weights_sha}, the manifest records {model.get('weights_sha256')}")
    return out


def _ranges(values: list[int]) -> str:
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}..{v}")
            start = None
    return ", ".join(parts)


def _graph_required(ev: RunEvidence) -> bool:
    return traits(ev.arm["engine"]).captures_graphs and ev.arm["graph"]["mode"] != "NONE"


# --- the registry: rule kinds and conditions a gate set may name -------------------------------------

RULES: dict[str, Callable[[RunEvidence, dict], list[str]]] = {
    "job-status": _job_status, "steps-once": _steps_once, "bitwise-zero": _bitwise_zero, "finite-metrics": _finite,
    "log-absent": _log_absent, "cuda-graph-engine": _cuda_graph, "operator-routes": _routes,
    "model-identity": _model_identity, "operator-readbacks": _readbacks,
}

CONDITIONS: dict[str, tuple[Callable[[RunEvidence], bool], str]] = {
    "always": (lambda ev: True, "always"),
    "all-operators-strict": (lambda ev: ev.all_strict, "every operator is R/R"),
    "graph-captured": (_graph_required, "vime arm with graph mode other than NONE"),
    "routes-required-or-printed": (lambda ev: traits(ev.arm["engine"]).routes_required or bool(ev.routes),
                                   "smoke arm, or the run printed route lines"),
    "model-identity-in-log": (lambda ev: traits(ev.arm["engine"]).model_identity_in_log and bool((ev.inputs or {}).get("model")),
                              "smoke arm whose manifest records the model hashes"),
    "readbacks-written": (lambda ev: bool(ev.readbacks), "the run wrote readbacks/*.json"),
}


REWARD_KEYS = (keys.RAW_REWARD, keys.REWARDS)
STEP_TIME_KEYS = (keys.STEP_TIME,)
GBS_KEY = keys.GLOBAL_BATCH_SIZE


def step_global_batch_size(payload: dict, arm: dict | None) -> int | None:
    """Samples per step: the step record's ``train/global_batch_size``, else the arm's workload value."""
    for value in (payload.get(GBS_KEY), ((arm or {}).get("workload") or {}).get("global_batch_size")):
        if _number(value) and value > 0:
            return int(value)
    return None


def mismatch_count(per_sample_mean, global_batch_size) -> float | int | None:
    """Bitwise-mismatched tokens of one step. VIME (and the smoke workload) log
    ``train_current_rollout_logprob_mismatch_count`` as a per-sample mean; the count is that mean
    times the global batch size (reference §4.2, as collect_results and ``kit analyze`` compute it)."""
    if not _number(per_sample_mean) or not _number(global_batch_size) or not math.isfinite(per_sample_mean):
        return None
    return whole_number(float(per_sample_mean) * global_batch_size)


def whole_number(value) -> float | int | None:
    """A count reconstructed from per-sample means is a whole number up to float error: keep it an int in
    the documents then (the run summary here, the suite summary's figures). ``whole_number(28793.0000001) == 28793``"""
    if value is None:
        return None
    value = float(value)
    return int(round(value)) if math.isfinite(value) and abs(value - round(value)) < 1e-6 else value


def summarize(ev: RunEvidence) -> dict:
    """Figures for the run's summary table: steps seen, last reward, mismatched-token counts (per-sample
    mean × global batch size, summed over steps and at the last step), max |Δlogp|, mean step time."""
    steps = ev.steps if not isinstance(ev.steps, RecordConflict) else {}
    train = [s for _, s in sorted(steps.items()) if "train" in s.payloads]
    counts = [c for c in (mismatch_count(s.value(MISMATCH_KEY), step_global_batch_size(s.payloads["train"], ev.arm))
                          for s in train) if c is not None]
    maxdiffs = [s.value(MAX_DIFF_KEY) for s in train if _number(s.value(MAX_DIFF_KEY))]
    times = [s.value(k) for s in steps.values() for k in STEP_TIME_KEYS if _number(s.value(k))]
    last = steps[max(steps)] if steps else None
    reward = next((last.value(k) for k in REWARD_KEYS if last and _number(last.value(k))), None)
    return {
        "steps_expected": ev.expected_steps,
        "steps_observed": len(train),
        "last_reward": _json_number(reward),
        "mismatch_count_total": _json_number(whole_number(sum(counts))) if counts else None,
        "mismatch_count_last": _json_number(counts[-1]) if counts else None,
        "max_abs_dlogp": _json_number(max(maxdiffs)) if maxdiffs else None,
        "mean_step_time_s": _json_number(sum(times) / len(times)) if times else None,
    }


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_number(v):
    if v is None or not _number(v) or not math.isfinite(v):
        return None
    return v
