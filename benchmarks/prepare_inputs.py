"""What the hash cache saves, and how fast the DAPO conversion runs, measured side by side in one run.

1. ``hash_tree`` over a model-like tree (4 files): cold (no cache) vs warm (size+mtime hits),
   against plain ``sha256`` of the same bytes.
2. The parquet -> JSONL conversion on a synthetic DAPO-shaped parquet with the published file's
   duplication pattern (about 100 copies of each ``extra_info.index``), rows per second, and the
   time it projects for the published file's ~1.79 M rows.

Usage: python benchmarks/prepare_inputs.py [MiB per file, default 128] [unique rows, default 1790]
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kit.inputs.files import hash_tree
from kit.inputs.prepare import convert_rows, read_rows

PUBLISHED_ROWS = 1_791_700  # approximate row count of the published train parquet (~17.9k problems, ~100 copies each)


def bench_hashing(root: Path, mib: int) -> list[tuple[str, float]]:
    model = root / "model"
    model.mkdir()
    block = os.urandom(1 << 20)
    for i in range(4):
        with open(model / f"model-{i:05d}-of-00004.safetensors", "wb") as fh:
            for _ in range(mib):
                fh.write(block)
    cache = root / "hashes.json"
    t0 = time.perf_counter()
    for p in sorted(model.iterdir()):
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    cold_files = hash_tree(model, cache)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm_files = hash_tree(model, cache)
    warm = time.perf_counter() - t0
    assert cold_files == warm_files
    return [("plain sha256 of the files", plain), ("hash_tree, cold cache", cold), ("hash_tree, warm cache", warm)]


def bench_conversion(root: Path, unique: int) -> tuple[int, int, float]:
    copies = 100
    n = unique * copies
    prompt_t = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
    idx = [f"{i % unique:08x}-0000-4000-8000-000000000000" for i in range(n)]
    text = "Solve the following math problem step by step. Let $x$ satisfy x² = 2; find x. " * 4
    table = pa.table({
        "data_source": pa.array(["math_dapo"] * n),
        "prompt": pa.array([[{"content": text + i, "role": "user"}] for i in idx], prompt_t),
        "ability": pa.array(["MATH"] * n),
        "reward_model": pa.array([{"ground_truth": "34", "style": "rule-lighteval/MATH_v2"}] * n,
                                 pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        "extra_info": pa.array([{"index": i} for i in idx], pa.struct([("index", pa.string())])),
    })
    src = root / "train.parquet"
    pq.write_table(table, src)
    t0 = time.perf_counter()
    counts = convert_rows(read_rows(src), io.StringIO())
    took = time.perf_counter() - t0
    assert counts.rows_written == unique
    return n, counts.rows_written, took


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    unique = int(sys.argv[2]) if len(sys.argv) > 2 else 1790
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = bench_hashing(root, mib)
        base = rows[0][1]
        print(f"hashing a 4-file tree of {4 * mib} MiB")
        print(f"{'method':32s} {'seconds':>9s} {'x plain':>8s}")
        for name, secs in rows:
            print(f"{name:32s} {secs:9.4f} {secs / base:8.4f}")
        n, written, took = bench_conversion(root, unique)
        rate = n / took
        print(f"\nconversion: {n} rows read, {written} written (dedup by extra_info.index) in {took:.2f} s "
              f"= {rate:,.0f} rows/s")
        print(f"projected for the published {PUBLISHED_ROWS:,} rows: {PUBLISHED_ROWS / rate:.1f} s")


if __name__ == "__main__":
    main()
