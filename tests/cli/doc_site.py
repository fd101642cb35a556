"""The documented commands, collected, and the site they run in (tests/cli/test_docs_commands.py).

A documented command is a `kit …` line inside a ``` block of README.md or docs/*.md, or a line under
`Examples:` of `kit --help` or any (sub)command's `--help`. Each runs in a shell, as written, in a scratch
directory that holds what the docs assume: `manifests` (the repository's), `.workspace` with a sealed
smoke pair r1 and r2 (signed with seal.pem), seal.pem/seal.pub and build.key, `runs/g10-s1234`-style
names for the pair, `RUNS/` with the committed GPU pair, and `../vime` (the smoke fixture checkout).
Placeholders (`<run-id>`, `<a>`, `<b>`, `<12 hex>`, `<64 hex>`, `sha256:...`) are filled from these.
A command that cannot run in CI is listed, with its reason, in tests/cli/doc_commands_not_run.json;
tests/cli/test_docs_commands.py runs the rest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOT_RUN_FILE = Path(__file__).with_name("doc_commands_not_run.json")
DEFAULT_SECONDS = 240
EXIT_COMMENT = re.compile(r"(?:^|\()exit (\d)\b")
TIMES_FILE = os.environ.get("KIT_DOCS_TIMES")     # where to append each command's wall time


@dataclass
class DocCommand:
    text: str                      # the command as written, comment removed, whitespace collapsed
    expected: int                  # 0, or the code the comment states (`# exit 1: ...`)
    sources: list[str] = field(default_factory=list)


def _split(line: str) -> tuple[str, str]:
    m = re.search(r"\s+#\s", line)
    return (line[:m.start()], line[m.end():]) if m else (line, "")


def _add(found: dict, line: str, source: str) -> None:
    text, comment = _split(line)
    text = " ".join(text.split())
    m = EXIT_COMMENT.search(comment.strip())
    cmd = found.setdefault(text, DocCommand(text, int(m.group(1)) if m else 0))
    cmd.sources.append(source)


def docs_commands() -> dict[str, DocCommand]:
    found: dict[str, DocCommand] = {}
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines, inside, pending = path.read_text().splitlines(), False, ""
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                inside, pending = not inside, ""
                continue
            if not inside:
                continue
            if pending:
                pending += " " + line.strip()
            elif line.strip().startswith("kit "):
                pending = line.strip()
            else:
                continue
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            _add(found, pending, f"{path.relative_to(REPO)}:{number}")
            pending = ""
    return found


def help_examples() -> dict[str, DocCommand]:
    import click

    from kit.cli import cli

    found: dict[str, DocCommand] = {}

    def walk(cmd, path, ctx):
        text = cmd.get_help(click.Context(cmd, info_name=path[-1], parent=ctx.parent))
        inside = False
        for line in text.splitlines():
            if line.strip() == "Examples:":
                inside = True
            elif inside and line.strip() and not line.startswith("    "):
                inside = False
            elif inside and line.strip().startswith("kit "):
                _add(found, line.strip(), f"{' '.join(path)} --help")
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                walk(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))

    walk(cli, ["kit"], click.Context(cli, info_name="kit"))
    return found


def not_run() -> dict[str, str]:
    return {entry["command"]: entry["reason"] for entry in json.loads(NOT_RUN_FILE.read_text())["not_run"]}


def _dirty() -> bool:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                         capture_output=True, text=True).stdout
    return bool(out.strip())


@dataclass
class Site:
    cwd: Path
    image_hex: str
    dirty: bool
    env: dict

    def fill(self, text: str) -> str:
        gpu = sorted(p.name for p in (self.cwd / "RUNS").iterdir())
        subs = [("<run-id>", "r1"), ("<a>", "r1"), ("<b>", "r2"), ("<12 hex>", self.image_hex),
                ("<hex>", self.image_hex), ("cpu-0123456789ab", f"cpu-{self.image_hex}"),
                ("<64 hex>", "0" * 64), ("sha256:...", "sha256:" + "0" * 64),
                ("RUNS/gpu-native-…", f"RUNS/{next(n for n in gpu if n.startswith('gpu-native'))}"),
                ("RUNS/gpu-consistency-…", f"RUNS/{next(n for n in gpu if n.startswith('gpu-consistency'))}")]
        for old, new in subs:
            text = text.replace(old, new)
        if self.dirty:
            # a development checkout: the kit refuses a run from it unless told (a clean clone, as in CI, runs as written)
            text = re.sub(r"^kit (run|reproduce|cluster slurm)\b", r"kit \1 --allow-dirty", text)
            text = re.sub(r"^kit (suite(?: --json)? module)\b", r"kit \1 --allow-dirty", text)
        return text

    def reset_outputs(self, line: str) -> None:
        """Remove what an earlier example wrote where this one writes (``--out``): outputs are never
        overwritten, and two examples may name one --out; an output another example reads stays."""
        for target in re.findall(r"--out[= ](\S+)", line):
            path = self.cwd / target
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()

    def run(self, command: DocCommand, seconds: int = DEFAULT_SECONDS) -> subprocess.CompletedProcess:
        line = self.fill(command.text)
        self.reset_outputs(line)
        proc = subprocess.Popen(["bash", "-c", line], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        started = time.monotonic()
        try:
            out, err = proc.communicate(timeout=seconds)
            if TIMES_FILE:
                with open(TIMES_FILE, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"command": command.text, "seconds": round(time.monotonic() - started, 1),
                                         "exit": proc.returncode}) + "\n")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"{line!r} ({', '.join(command.sources)}) did not end within {seconds} s")
        return subprocess.CompletedProcess(line, proc.returncode, out, err)


def _kit(cwd: Path, env: dict, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"kit {' '.join(args)}: {proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture(scope="session")
def doc_site(tmp_path_factory, cpu_image, kit_workspace, smoke_source_repos):
    """The scratch directory the documented commands run in (see the module docstring)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    root = tmp_path_factory.mktemp("docs-site")
    cwd = root / "site"
    cwd.mkdir()
    # the wheels the session's image was built from: a documented build here reuses them, not the index
    (cwd / ".workspace").mkdir()
    (cwd / ".workspace" / "wheelhouse").symlink_to(kit_workspace / "wheelhouse", target_is_directory=True)
    # a copy: `kit lock` and `kit build` examples write next to the locks, never into the repository
    shutil.copytree(REPO / "manifests", cwd / "manifests")
    shutil.copytree(cpu_image.sources["vime"], root / "vime", symlinks=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    (cwd / "seal.pem").write_bytes(pem)
    (cwd / "build.key").write_bytes(pem)       # one key, so `--key seal.pub` also trusts the build's provenance
    (cwd / "seal.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    from kit.model.catalog import Catalog

    # the smoke stack resolved, as an image embeds it (kit probe --check-stack reads a resolved stack)
    (cwd / "stack.json").write_text(json.dumps(Catalog.load(cwd / "manifests").stack("smoke").document))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIT_", "RAY_ADDRESS", "PYTEST"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    dirty = _dirty()
    extra = ["--allow-dirty"] if dirty else []
    # the session's image, its provenance signed with build.key in this workspace (the docs verify it)
    built = _kit(cwd, env, "build", "cpu", "--arm", "smoke", "--sign-key", "build.key", "--json",
                 *[f"--source={name}={path}" for name, path in sorted(smoke_source_repos.items())])
    # a native / consistency pair (operators the declared factor): compared and analysed as the docs show
    for run_id, mode in (("r1", "native"), ("r2", "consistency")):
        _kit(cwd, env, "run", "--arm", "smoke", "--mode", mode, "--rollouts", "6", "--run-id", run_id,
             "--sign-key", "seal.pem", *extra)
    runs = cwd / "runs"
    runs.mkdir()
    for name, run_id in (("g10-s1234", "r1"), ("g11-s1234", "r2"), ("g10", "r1"), ("g11", "r2")):
        (runs / name).symlink_to(cwd / ".workspace" / "runs" / run_id)
    for name, run_id in (("G10.log", "r1"), ("G11.log", "r2")):
        shutil.copyfile(cwd / ".workspace" / "runs" / run_id / "run.log", cwd / name)
    shutil.copytree(REPO / "tests" / "data" / "gpu-pair", cwd / "RUNS")
    image_hex = json.loads(built)["tag"].rsplit("cpu-", 1)[-1]     # the image whose provenance the site holds
    return Site(cwd, image_hex, dirty, env)


@pytest.fixture(scope="session")
def slurm_host():
    proc = subprocess.run([str(REPO / "scripts" / "ensure-slurm.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, f"scripts/ensure-slurm.sh failed:\n{proc.stderr[-2000:]}"


def check(site: Site, command: DocCommand, seconds: int = DEFAULT_SECONDS) -> None:
    proc = site.run(command, seconds)
    where = ", ".join(command.sources)
    assert proc.returncode == command.expected, (
        f"{proc.args!r} ({where}) exit {proc.returncode}, documented {command.expected}:\n"
        f"stdout: {proc.stdout[-1500:]}\nstderr: {proc.stderr[-2500:]}")
    assert "Traceback (most recent call last)" not in proc.stderr, f"{proc.args!r}: {proc.stderr[-2500:]}"
    assert "kit: internal error" not in proc.stderr, f"{proc.args!r}: {proc.stderr[-1000:]}"
