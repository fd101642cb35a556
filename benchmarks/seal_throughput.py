"""Seal-and-verify throughput of kit.evidence against `sha256sum` on a synthetic bundle, side by side.

    python benchmarks/seal_throughput.py [--gib 2] [--files 16]

Writes a run dir of random files (plus a minimal manifest), then times, each on the same files:
`sha256sum` over every file (one process, as a person would check a bundle), the kit's seal
(hash + seal.json) and the kit's verify (re-hash + compare). Prints MB/s and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from conftest import seal_test_run
    from kit.evidence import bundle as E
    from kit.evidence.audit import verify_run_dir
    from test_evidence import minimal_manifest

    total = int(args.gib * (1 << 30))
    per_file = total // args.files
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        run_dir = E.create_run_dir(Path(tmp), "bench")
        E.write_document(run_dir, "manifest.json", minimal_manifest("bench"))
        block = os.urandom(1 << 24)
        for i in range(args.files):
            with open(run_dir / f"shard-{i:03d}.bin", "wb") as fh:
                for _ in range(per_file // len(block)):
                    fh.write(block)
        files = sorted(str(p) for p in run_dir.iterdir())
        size = sum(os.path.getsize(f) for f in files)
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache for everyone

        t = time.perf_counter()
        subprocess.run(["sha256sum", *files], stdout=subprocess.DEVNULL, check=True)
        sha256sum_s = time.perf_counter() - t
        t = time.perf_counter()
        seal_test_run(run_dir, "bench", gate_set_version="bench")
        seal_s = time.perf_counter() - t
        t = time.perf_counter()
        verdict = verify_run_dir(run_dir)
        verify_s = time.perf_counter() - t
        assert verdict.status == "ok", verdict.problems
    mb = size / 1e6
    result = {
        "bundle_bytes": size, "files": len(files), "cpus": os.cpu_count(),
        "sha256sum_s": round(sha256sum_s, 3), "seal_s": round(seal_s, 3), "verify_s": round(verify_s, 3),
        "sha256sum_MBps": round(mb / sha256sum_s, 1), "seal_MBps": round(mb / seal_s, 1), "verify_MBps": round(mb / verify_s, 1),
        "seal_time_over_sha256sum": round(seal_s / sha256sum_s, 3),
        "verify_time_over_sha256sum": round(verify_s / sha256sum_s, 3),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
