"""Reader for VIME metric records: ``rollout N: {...}``, ``step N: {...}``, ``perf N: {...}``.

VIME logs Python dict reprs. Lines may carry Ray actor prefixes (``(TrainActor pid=12) step 3: {...}``)
and ANSI colour escapes; values may be bare ``inf``/``nan``. Example::

    >>> [r.kind for r in parse_records(["(pid=1) step 0: {'train/loss': inf}"])]
    ['step']
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
RECORD_RE = re.compile(r"\b(rollout|step|perf)\s+(\d+):\s+(\{.*\})\s*$")
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
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
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


def parse_records(lines: Iterable[str]) -> Iterator[Record]:
    """Yield every record line; lines that do not hold a parseable record are skipped."""
    for number, raw in enumerate(lines, start=1):
        line = ANSI_RE.sub("", raw.rstrip("\n"))
        match = RECORD_RE.search(line)
        if not match:
            continue
        try:
            payload = _literal(match.group(3))
        except (ValueError, TypeError, SyntaxError, RecursionError):
            payload = None
        if payload is None:
            continue
        yield Record(match.group(1), int(match.group(2)), payload, number)


def is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
