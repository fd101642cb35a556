"""The local source cache: archives and checkouts are checked by commit and recomputed tree before
anything is built; a missing source or an archive of another commit stops `kit build` at once."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import run_kit
from kit.build.source_cache import archive_commit, archive_tree, source_cache_problems

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=ENV).stdout.decode().strip()


def repo_with_two_commits(path: Path) -> tuple[str, str, str, str]:
    """(first commit, its tree, second commit, its tree)."""
    path.mkdir()
    git(path, "init", "-q")
    (path / "a.py").write_text("x = 1\n")
    (path / "pkg").mkdir()
    (path / "pkg" / "b.txt").write_text("b\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "one")
    first, first_tree = git(path, "rev-parse", "HEAD"), git(path, "rev-parse", "HEAD^{tree}")
    (path / "a.py").write_text("x = 2\n")
    git(path, "commit", "-qam", "two")
    return first, first_tree, git(path, "rev-parse", "HEAD"), git(path, "rev-parse", "HEAD^{tree}")


def archive(repo: Path, commit: str, out: Path, name: str) -> Path:
    subprocess.run(["git", "-C", str(repo), "archive", "--format=tar.gz", f"--prefix={name}/", "-o", str(out), commit],
                   check=True, env=ENV)
    return out


def stack(commit: str, tree: str | None = None) -> dict:
    src = {"name": "lib", "repository": "https://example.org/lib.git", "commit": commit}
    if tree:
        src["tree"] = tree
    return {"name": "s", "sources": [src]}


def test_archive_at_the_pin_is_accepted_by_commit_and_tree(tmp_path):
    first, first_tree, _, _ = repo_with_two_commits(tmp_path / "repo")
    cache = tmp_path / "cache"
    cache.mkdir()
    path = archive(tmp_path / "repo", first, cache / f"lib-{first[:8]}.tar.gz", "lib")
    assert archive_commit(path) == first and archive_tree(path) == first_tree
    assert source_cache_problems(stack(first, first_tree), cache) == []


def test_archive_of_another_commit_is_refused_by_commit_and_tree(tmp_path):
    first, first_tree, second, second_tree = repo_with_two_commits(tmp_path / "repo")
    cache = tmp_path / "cache"
    cache.mkdir()
    archive(tmp_path / "repo", second, cache / f"lib-{first[:8]}.tar.gz", "lib")   # the right name, another commit
    [problem] = source_cache_problems(stack(first, first_tree), cache)
    assert first in problem and f"holds commit {second}" in problem
    assert f"has tree {second_tree}, the stack pins tree {first_tree}" in problem


def test_missing_source_names_the_pin_and_the_flag(tmp_path):
    [problem] = source_cache_problems(stack("1" * 40), tmp_path)
    assert "source lib" in problem and "1" * 40 in problem and "--source lib=PATH" in problem


def test_g11_stops_before_anything_naming_rl_kernel_and_vime(tmp_path):
    cache, workspace = tmp_path / "sources", tmp_path / "ws"
    cache.mkdir()
    proc = run_kit("build", "cuda", "--arm", "G11", "--sources", str(cache), "--workspace", str(workspace))
    assert proc.returncode == 1, proc.stderr
    assert "source rl-kernel" in proc.stderr and "source vime" in proc.stderr and "5403df6e3c52" in proc.stderr
    assert "Traceback" not in proc.stderr and not workspace.exists()   # nothing fetched, exported or built


def test_sources_flag_must_name_a_directory(tmp_path):
    proc = run_kit("build", "cuda", "--arm", "G11", "--sources", str(tmp_path / "nope"), "--json")
    assert proc.returncode == 2 and "--sources" in proc.stderr
    assert not proc.stdout or json.loads(proc.stdout) is None
