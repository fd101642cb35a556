"""DAPO-Math parquet rows to the JSONL prompt file VIME reads: a pure conversion, row by row, with counts.

Example::

    counts = convert_rows(read_rows(Path("train.parquet")), out)      # ConversionCounts(rows=17917, written=17917, …)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, TextIO

from kit.model.errors import BadInput

COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
RECORD_FIELDS = ("prompt", "label", "data_source", "ability", "source_index", "reward_style")

# --- parquet -> JSONL (pure conversion) --------------------------------------------------------

@dataclass(frozen=True)
class ConversionCounts:
    rows_read: int
    rows_written: int

    @property
    def duplicates_removed(self) -> int:
        return self.rows_read - self.rows_written


def open_parquet(source: Path):
    """The parquet file, after checking it is readable and has the five DAPO columns (reads no rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not source.exists():
        raise BadInput(f"{source}: no such file (expected the DAPO-Math-17k parquet)")
    if not source.is_file():
        raise BadInput(f"{source}: not a regular file (expected the DAPO-Math-17k parquet)")
    try:
        parquet = pq.ParquetFile(source)
        names = set(parquet.schema_arrow.names)
    except (pa.ArrowException, OSError) as exc:
        raise BadInput(f"{source}: not a readable parquet file ({_first_line(exc)})") from None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise BadInput(f"{source}: missing column(s) {', '.join(missing)}; "
                       f"a DAPO-Math-17k parquet has {', '.join(COLUMNS)}")
    return parquet


def read_rows(source: Path, batch_size: int = 4096) -> Iterator[dict]:
    """The five columns of a DAPO parquet file, row by row; BadInput when the file cannot serve them."""
    import pyarrow as pa

    parquet = open_parquet(source)
    try:
        for batch in parquet.iter_batches(batch_size=batch_size, columns=list(COLUMNS)):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise BadInput(f"{source}: corrupt parquet data ({_first_line(exc)})") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def record_from_row(row: dict, row_number: int) -> tuple[str, dict]:
    """``(source_index, record)`` for one parquet row; the record's key order is the file format.

    >>> record_from_row({"data_source": "d", "prompt": [{"content": "1+1?", "role": "user"}],
    ...   "ability": "MATH", "reward_model": {"ground_truth": "2", "style": "rule"},
    ...   "extra_info": {"index": "a"}}, 1)[1]["label"]
    '2'
    """
    extra = row.get("extra_info")
    index = extra.get("index") if isinstance(extra, dict) else None
    if not isinstance(index, str) or not index:
        raise BadInput(f"row {row_number}: extra_info.index is {index!r}; expected a non-empty string")
    reward = row.get("reward_model")
    reward = reward if isinstance(reward, dict) else {}
    label = reward.get("ground_truth")
    if not isinstance(label, str) or not label:
        raise BadInput(f"row {row_number} (index {index}): reward_model.ground_truth is {label!r}; "
                       "expected a non-empty string")
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise BadInput(f"row {row_number} (index {index}): prompt is {type(prompt).__name__}; "
                       "expected a non-empty chat list")
    record = {
        "prompt": prompt,
        "label": label,
        "data_source": row.get("data_source"),
        "ability": row.get("ability"),
        "source_index": index,
        "reward_style": reward.get("style"),
    }
    return index, record


def convert_rows(rows: Iterable[dict], out: TextIO) -> ConversionCounts:
    """Write one compact JSON line per first occurrence of ``extra_info.index``; non-ASCII kept as is."""
    seen: set[str] = set()
    read = written = 0
    for read, row in enumerate(rows, start=1):
        index, record = record_from_row(row, read)
        if index in seen:
            continue
        seen.add(index)
        out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
        out.write("\n")
        written += 1
    return ConversionCounts(read, written)


