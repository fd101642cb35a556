"""Writing an analysis into ``--out DIR``: all files or none, and never over an existing file.

Everything is produced in a temporary directory beside DIR first. A new DIR is then renamed into
place in one step; into an existing DIR each file is hard-linked, which fails instead of replacing
a file, and the files already linked are removed again. Example::

    publish(Path("report"), lambda tmp: write_csv(tmp / "a.csv", ["x"], [{"x": 1}]) or ["a.csv"])
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from kit.model.errors import BadInput
from kit.model.documents import dumps_pretty, require_valid


def refuse_existing(out_dir: Path, names: Iterable[str]) -> None:
    """BadInput naming the first output file that already exists (checked before any work)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"--out {out_dir}: exists and is not a directory")
    for name in names:
        if (out_dir / name).exists():
            raise BadInput(f"{out_dir / name}: already exists; analysis outputs are never overwritten "
                           "(choose a new --out directory)")


def publish(out_dir: Path, produce: Callable[[Path], list[str]]) -> list[Path]:
    out_dir = Path(out_dir)
    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    except OSError as exc:
        raise BadInput(f"--out {out_dir}: cannot create ({exc.strerror})") from None
    try:
        names = produce(tmp)
        if not out_dir.exists():
            try:
                os.rename(tmp, out_dir)
                return [out_dir / n for n in names]
            except OSError:
                pass  # created meanwhile: fall through to per-file exclusive links
        refuse_existing(out_dir, names)
        linked: list[Path] = []
        try:
            for name in names:
                os.link(tmp / name, out_dir / name)
                linked.append(out_dir / name)
        except FileExistsError:
            for path in linked:
                path.unlink(missing_ok=True)
            raise BadInput(f"{out_dir / name}: already exists; analysis outputs are never overwritten") from None
        return linked
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cell(value) -> str:
    """CSV text of a value: repr for floats (round-trips exactly), empty for unknown."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(path: Path, columns: Iterable[str], rows: Iterable[dict]) -> str:
    columns = list(columns)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([cell(row.get(c)) for c in columns])
    return path.name


def write_json(path: Path, doc: dict, expected: str) -> str:

    require_valid(doc, path.name, expected)
    path.write_text(dumps_pretty(doc), encoding="utf-8")
    return path.name
