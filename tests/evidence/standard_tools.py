"""The standard verifiers, installed from PyPI into a virtualenv of their own that does not hold the kit.

A test that runs them proves that kit-written evidence checks out with the ecosystem's tools alone:
OpenSSF model signing (`model_signing verify key`), securesystemslib's DSSE `Envelope.verify` and the
in-toto attestation model (through scripts/verify-in-toto.py, which imports nothing of the kit).
The venv is made once per machine under the cache dir (reused while its requirements are the same;
KIT_TEST_VERIFIER_VENV names another place) and checked to be unable to import the kit.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# model-signing 1.1.1 imports OpenSSL (pyOpenSSL) without declaring it, so it is named here.
REQUIREMENTS = ("model-signing==1.1.1", "pyopenssl==26.4.0", "securesystemslib==1.6.0", "in-toto==3.1.0")
VERIFY_IN_TOTO = REPO / "scripts" / "verify-in-toto.py"


@dataclass(frozen=True)
class StandardTools:
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *args: str, cwd: Path) -> subprocess.CompletedProcess:
        """Run a tool of the venv (``model_signing``, ``python``) from ``cwd``, never the repository."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        return subprocess.run([str(self.venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)

    def model_signing_verify(self, directory: Path, signature: Path, public_key: Path, cwd: Path):
        return self.run("model_signing", "verify", "key", str(directory), "--signature", str(signature),
                        "--public_key", str(public_key), cwd=cwd)

    def model_signing_sign(self, directory: Path, signature: Path, private_key: Path, cwd: Path):
        return self.run("model_signing", "sign", "key", str(directory), "--signature", str(signature),
                        "--private_key", str(private_key), cwd=cwd)

    def verify_in_toto(self, envelope: Path, public_key: Path, cwd: Path, *extra: str):
        return self.run("python", str(VERIFY_IN_TOTO), "--key", str(public_key), *extra, str(envelope), cwd=cwd)


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlk-kit"


@pytest.fixture(scope="session")
def standard_tools(tmp_path_factory) -> StandardTools:
    tag = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:12]
    venv = Path(os.environ.get("KIT_TEST_VERIFIER_VENV") or _cache_root() / f"standard-verifiers-{tag}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "installed").is_file():      # made last: a half-made venv is made again
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
            pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                                  "--disable-pip-version-check", *REQUIREMENTS], capture_output=True, text=True,
                                 timeout=900)
            assert pip.returncode == 0, f"pip install {' '.join(REQUIREMENTS)} failed:\n{pip.stderr[-3000:]}"
            (venv / "installed").write_text("\n".join(REQUIREMENTS) + "\n")
    tools = StandardTools(venv)
    scratch = tmp_path_factory.mktemp("kit-free")
    probe = tools.run("python", "-c", "import kit", cwd=scratch)
    assert probe.returncode != 0 and "No module named 'kit'" in probe.stderr, \
        f"the verifiers' venv {venv} can import the kit; it must not: {probe.stdout}{probe.stderr}"
    return tools
