"""Reader for VIME metric records: ``rollout N: {...}``, ``step N: {...}``, ``perf N: {...}``.

VIME logs Python dict reprs. Lines may carry Ray actor prefixes (``(TrainActor pid=12) step 3: {...}``)
and ANSI colour escapes; values may be bare ``inf``/``nan``. A line that looks like a record but whose
dict does not parse is never dropped silently: pass a list as ``unparseable`` and it receives one
:class:`UnparseableLine` (line number, kind, step, why) per such line. Example::

    >>> [r.kind for r in parse_records(["(pid=1) step 0: {'train/loss': inf}"])]
    ['step']
    >>> bad = []
    >>> list(parse_records(["perf 3: {'perf/step_time': 1.0"], bad)), bad[0].line_number
    ([], 1)
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
RECORD_RE = re.compile(r"\b(rollout|step|perf)\s+(\d+):\s+(\{.*\})\s*$")
# the start of a record whose line was cut before its closing brace (a truncated log)
RECORD_START_RE = re.compile(r"\b(rollout|step|perf)\s+(\d+):\s+\{")
# bare inf/nan (as repr prints them) become float constants before literal_eval
_NONFINITE_RE = re.compile(r"(?<![\w'\".])(-?)(inf|nan)(?![\w'\"])")


@dataclass(frozen=True)
class Record:
    kind: str          # "rollout" | "step" | "perf"
    step: int
    payload: dict
    line_number: int   # 1-based line in the source


def _literal(payload_text: str) -> dict | None:
    text = _NONFINITE_RE.sub(lambda m: f"float('{m.group(1)}{m.group(2)}')", payload_text)
    tree = ast.parse(text, mode="eval")  # SyntaxError: the caller reports the line
    value = _eval_node(tree.body)
    return value if isinstance(value, dict) else None


def _eval_node(node):
    # literal_eval plus exactly one call form: float('inf'|'-inf'|'nan')
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" \
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
            and node.args[0].value in ("inf", "-inf", "nan"):
        return float(node.args[0].value)
    if isinstance(node, ast.Dict):
        return {_eval_node(k): _eval_node(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_eval_node(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    return ast.literal_eval(node)


@dataclass(frozen=True)
class UnparseableLine:
    """A line that matches ``<kind> N: {...}`` but whose dict is not a Python literal dict."""

    line_number: int   # 1-based line in the source
    kind: str
    step: int
    reason: str

    def describe(self, source: str) -> str:
        """``run.log:17: perf 3 record does not parse (unexpected EOF); skipped``"""
        return f"{source}:{self.line_number}: {self.kind} {self.step} record does not parse ({self.reason}); skipped"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:120]}" if text else type(exc).__name__


def parse_records(lines: Iterable[str], unparseable: list | None = None) -> Iterator[Record]:
    """Yield every record line. Lines that are no record are skipped; a record line whose dict does
    not parse is skipped too, and reported into ``unparseable`` when a list is given."""
    for number, raw in enumerate(lines, start=1):
        line = ANSI_RE.sub("", raw.rstrip("\n"))
        match = RECORD_RE.search(line)
        if not match:
            cut = RECORD_START_RE.search(line) if unparseable is not None else None
            if cut:
                unparseable.append(UnparseableLine(number, cut.group(1), int(cut.group(2)),
                                                   "no closing brace: the line is cut"))
            continue
        reason = "not a dict literal"
        try:
            payload = _literal(match.group(3))
        except SyntaxError as exc:
            payload, reason = None, f"syntax error: {exc.msg}"
        except ValueError:
            payload, reason = None, "not a literal: names or calls other than inf/nan"
        except (TypeError, RecursionError, MemoryError) as exc:
            payload, reason = None, _first_line(exc)
        if payload is None:
            if unparseable is not None:
                unparseable.append(UnparseableLine(number, match.group(1), int(match.group(2)), reason))
            continue
        yield Record(match.group(1), int(match.group(2)), payload, number)


def is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- tidy per-step view ---------------------------------------------------------------------------

# The two perf lines of one step are told apart by a key only one side prints (reference §4.1).
PERF_TRAIN_MARKER = "perf/step_time"
PERF_ROLLOUT_MARKER = "perf/rollout_time"
# record slot -> the key prefixes it owns; lookups try the owning slot first
SLOTS = ("rollout", "train", "perf_rollout", "perf_train")


class RecordConflict(ValueError):
    """Two records claim the same (slot, step) with different contents, or a record cannot be placed."""


@dataclass(frozen=True)
class StepRecords:
    """Every record of one step, by slot; a slot absent from the log is an empty dict.

    ``value("perf/rollout_time")`` looks the key up in the slot that owns its prefix first::

        >>> s = StepRecords(0, {"perf_rollout": {"perf/rollout_time": 2.0}}, {})
        >>> s.value("perf/rollout_time")
        2.0
    """

    step: int
    payloads: dict          # slot -> payload dict
    line_numbers: dict      # slot -> 1-based line of the first occurrence
    # slot -> 1-based lines of later identical copies. Analysis of collected logs reads through them;
    # the run gates refuse them, since a run's own log prints each record once.
    repeats: dict = field(default_factory=dict)

    def value(self, key: str, default=None):
        for slot in _slot_order(key):
            payload = self.payloads.get(slot)
            if payload and key in payload:
                return payload[key]
        return default


def _slot_order(key: str) -> tuple[str, ...]:
    if key.startswith("perf/"):
        return ("perf_train", "perf_rollout", "train", "rollout")
    if key.startswith("rollout/"):
        return ("rollout", "perf_rollout", "perf_train", "train")
    return ("train", "perf_train", "rollout", "perf_rollout")


def slot_of(record: Record) -> str:
    """Which of the four per-step slots a record fills; perf lines are told apart by their keys."""
    if record.kind == "rollout":
        return "rollout"
    if record.kind == "step":
        return "train"
    has_train, has_rollout = PERF_TRAIN_MARKER in record.payload, PERF_ROLLOUT_MARKER in record.payload
    if has_train and not has_rollout:
        return "perf_train"
    if has_rollout and not has_train:
        return "perf_rollout"
    which = "both" if has_train else "neither"
    raise RecordConflict(
        f"line {record.line_number}: perf {record.step} holds {which} of {PERF_ROLLOUT_MARKER!r} "
        f"(rollout side) and {PERF_TRAIN_MARKER!r} (train side); each perf line must hold exactly one")


def _same(a, b) -> bool:
    # nan != nan, yet two identical printed lines with nan are the same record
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def collect_steps(records: Iterable[Record]) -> dict[int, StepRecords]:
    """Group records by step into slots; identical repeats collapse (their lines are kept in
    ``repeats``), conflicting repeats raise.

    Steps are the union of step indices over all record kinds. Example::

        >>> steps = collect_steps(parse_records(["step 0: {'train/loss': 1.0}", "step 0: {'train/loss': 1.0}"]))
        >>> steps[0].value("train/loss"), steps[0].line_numbers["train"], steps[0].repeats["train"]
        (1.0, 1, (2,))
    """
    payloads: dict[int, dict] = {}
    lines: dict[int, dict] = {}
    repeats: dict[int, dict] = {}
    for record in records:
        slot = slot_of(record)
        have = payloads.setdefault(record.step, {})
        if slot in have:
            if not _same(have[slot], record.payload):
                first = lines[record.step][slot]
                label = record.kind if record.kind != "perf" else f"perf ({slot.split('_')[1]} side)"
                raise RecordConflict(
                    f"lines {first} and {record.line_number}: two different {label} records for step "
                    f"{record.step}; a log must hold one run (repeated lines must be identical)")
            slots = repeats.setdefault(record.step, {})
            slots[slot] = slots.get(slot, ()) + (record.line_number,)
            continue
        have[slot] = record.payload
        lines.setdefault(record.step, {})[slot] = record.line_number
    return {step: StepRecords(step, payloads[step], lines[step], repeats.get(step, {})) for step in sorted(payloads)}


GENERATION_RE = re.compile(r"Rollout generation:.*100%.*\[(\d+):(\d+)<")


def generation_progress_seconds(lines: Iterable[str]) -> list[int]:
    """Elapsed seconds of each finished tqdm ``Rollout generation ... 100%`` bar, in log order."""
    out = []
    for raw in lines:
        line = ANSI_RE.sub("", raw)
        if "Rollout generation:" in line and "100%" in line:
            match = GENERATION_RE.search(line)
            if match:
                out.append(int(match.group(1)) * 60 + int(match.group(2)))
    return out
