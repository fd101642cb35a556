"""Deterministic fixture git repositories that stand in for RL-Kernel, VIME and Megatron-LM.

The smoke stack (``manifests/stack-smoke.json``) pins sources named ``fixture:<name>``. Their
content, author, committer and dates are fixed here, so every machine that materializes them gets
the same commit SHAs and the stack can pin those SHAs like real ones. Example::

    repo = materialize("vime", tmp_path / "vime")
    head_commit(repo) == FIXTURE_COMMITS["vime"]     # checked by the tests

A commit is a function of content and metadata only: fixed names, e-mails, dates and messages, no
signing, and a fixed file mode. ``extra_commit`` makes a second commit for tests that need a
source at another commit than the pin.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kit.model.errors import BadInput

# Fixed identity of every fixture commit: same content + same metadata = same SHA everywhere.
_FIXED_ENV = {
    "GIT_AUTHOR_NAME": "rlk-kit fixtures",
    "GIT_AUTHOR_EMAIL": "fixtures@rlk-kit.dev",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "rlk-kit fixtures",
    "GIT_COMMITTER_EMAIL": "fixtures@rlk-kit.dev",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "LC_ALL": "C",
}
_GIT_OPTS = ["-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", "-c", "init.defaultBranch=main",
             "-c", "core.fileMode=true", "-c", "safe.directory=*"]

_GITIGNORE = "__pycache__/\n*.pyc\nbuild/\n*.egg-info/\n"

# name -> {path: content}. Small but shaped like the real projects, so the probe and the image see
# the same layout: a Python package, a script, a README.
FIXTURE_FILES: dict[str, dict[str, str]] = {
    "rl-kernel": {
        ".gitignore": _GITIGNORE,
        "README.md": "# RL-Kernel (smoke fixture)\n\nStands in for RL-Align/RL-Kernel in the CPU smoke image.\n",
        "rl_kernel/__init__.py": '"""Smoke fixture of RL-Kernel: no compiled extensions."""\n\n__version__ = "0.0.0+fixture"\n\n\ndef strict_sum(values):\n    """Left-to-right float sum: the order is part of the result."""\n    total = 0.0\n    for v in values:\n        total += float(v)\n    return total\n',
    },
    "vime": {
        ".gitignore": _GITIGNORE,
        "README.md": "# VIME (smoke fixture)\n\nStands in for RL-Align/vime in the CPU smoke image.\n",
        "vime/__init__.py": '"""Smoke fixture of VIME."""\n\n__version__ = "0.0.0+fixture"\nTOPOLOGY = {"tp": 2, "cp": 2}\n',
        "scripts/run-smoke.sh": "#!/bin/sh\nexec python -c 'import vime; print(vime.TOPOLOGY)'\n",
    },
    "megatron-lm": {
        ".gitignore": _GITIGNORE,
        "README.md": "# Megatron-LM (smoke fixture)\n\nStands in for NVIDIA/Megatron-LM in the CPU smoke image.\n",
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": '"""Smoke fixture of megatron.core."""\n\n__version__ = "0.0.0+fixture"\n',
    },
}
_EXECUTABLE = {"vime": {"scripts/run-smoke.sh"}}

# The commits the files above produce (checked by tests/build/test_images_plan.py against a fresh
# materialization and against manifests/stack-smoke.json).
FIXTURE_COMMITS: dict[str, str] = {
    "rl-kernel": "4bda521b68ba6092becc6034841440af4ebb5bdd",
    "vime": "901ded1d3ba6b50ff3ae85bc9f58d3aab68c6401",
    "megatron-lm": "e1dc16b0bfe3843bdb55197994b227da9a2edfe9",
}


def git(repo: Path | str, *args: str, input: bytes | None = None, env: dict | None = None) -> str:
    """Run git in ``repo`` with the fixed identity; return stdout (stripped)."""
    full_env = {**os.environ, **_FIXED_ENV, **(env or {})}
    proc = subprocess.run(["git", *_GIT_OPTS, "-C", str(repo), *args], input=input,
                          capture_output=True, env=full_env)
    if proc.returncode != 0:
        raise BadInput(f"{repo}: git {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode(errors="replace").strip()


def fixture_names() -> list[str]:
    return sorted(FIXTURE_FILES)


def materialize(name: str, dest: Path | str) -> Path:
    """Create the fixture repository ``name`` at ``dest`` (must not exist or be empty); return it.

    ``materialize("vime", p)`` then ``git -C p rev-parse HEAD`` == ``FIXTURE_COMMITS["vime"]``.
    """
    if name not in FIXTURE_FILES:
        raise BadInput(f"unknown fixture source {name!r}; fixtures: {', '.join(fixture_names())}")
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise BadInput(f"{dest}: exists and is not empty; fixture sources are made in a fresh directory")
    dest.mkdir(parents=True, exist_ok=True)
    git(dest, "init", "-q")
    for rel, text in sorted(FIXTURE_FILES[name].items()):
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755 if rel in _EXECUTABLE.get(name, set()) else 0o644)
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"{name}: smoke fixture")
    return dest


def extra_commit(repo: Path | str, relpath: str = "EXTRA.md", text: str = "another commit\n") -> str:
    """Add one more deterministic commit (for 'source at another commit' tests); return its SHA."""
    repo = Path(repo)
    (repo / relpath).write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"extra: {relpath}", env={
        "GIT_AUTHOR_DATE": "2026-01-02T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-02T00:00:00+0000"})
    return head_commit(repo)


def head_commit(repo: Path | str) -> str:
    return git(repo, "rev-parse", "HEAD")
