"""Where things go in a workspace directory: ``data/``, ``downloads/``, ``checkpoints/``, ``provenance/``,
``cache/`` and ``runs/``. Pure paths: nothing here reads or writes. Example::

    Workspace(Path("ws")).checkpoint_dir("ab" * 32, "cd" * 32)   # ws/checkpoints/torch_dist-abab…-cdcd…
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

PUBLISHED_URL = ("https://huggingface.co/datasets/BytedTsinghua-SIA/DAPO-Math-17k/"
                 "resolve/main/data/train-00000-of-00001.parquet")
DATASET_NAME = "dapo-math-17k"


@dataclass(frozen=True)
class Workspace:
    """The layout of a workspace directory: ``data/``, ``downloads/``, ``checkpoints/``, ``cache/``."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data" / f"{DATASET_NAME}.jsonl"

    @property
    def data_provenance(self) -> Path:
        return self.root / "data" / f"{DATASET_NAME}.provenance.json"

    @property
    def hash_cache(self) -> Path:
        return self.root / "cache" / "hashes.json"

    @property
    def provenance_dir(self) -> Path:
        return self.root / "provenance"

    def download_path(self, url: str) -> Path:
        name = Path(urlparse(url).path).name or "download"
        tag = "published" if url == PUBLISHED_URL else _short(_sha256_text(url))
        return self.root / "downloads" / f"{tag}-{name}"

    def model_provenance(self, model_tree_sha256: str) -> Path:
        return self.provenance_dir / f"model-{_short(model_tree_sha256)}.json"

    def checkpoint_dir(self, stack_sha256: str, model_tree_sha256: str) -> Path:
        """One converted checkpoint per (stack, model) pair: the converter's Megatron shapes the bytes."""
        return self.root / "checkpoints" / f"torch_dist-{_short(stack_sha256)}-{_short(model_tree_sha256)}"

    def checkpoint_provenance(self, checkpoint_dir: Path) -> Path:
        return checkpoint_dir.with_name(checkpoint_dir.name + ".provenance.json")


def _short(hexdigest: str) -> str:
    return hexdigest[:12]


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
