"""A real sealed smoke run (kit run, local runtime, one rollout, signed), made once per session and
copied by the tamper matrix and the fault tests; an unsigned copy is re-sealed from the same files."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kit.evidence import bundle as E


def write_keypair(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    directory.mkdir(parents=True, exist_ok=True)
    priv, pub = directory / "seal.pem", directory / "seal.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def kit(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=timeout)


# Secrets a deny-list by name used to miss, a URL password holding '@' and '/', and two variables whose
# values occur in a good run's output (a redactor that scrubbed them would rewrite the log and the status).
SECRETS = {"DB_PASS": "db-pass-7731", "MYSQL_PWD": "mysql-pwd-7731", "CI_JOB_JWT": "eyJjwt.7731.sig",
           "SENTRY_DSN": "https://dsnkey7731@sentry.example/1", "SLACK_WEBHOOK_URL": "https://hooks.example/T7731/B/secretpath",
           "AZURE_STORAGE_CONNECTION_STRING": "AccountKey=azure7731key;EndpointSuffix=core",
           "HTTPS_PROXY": "http://user:p@ss/w0rd-7731@127.0.0.1:9"}
SECRET_VALUES = ("db-pass-7731", "mysql-pwd-7731", "eyJjwt.7731.sig", "dsnkey7731", "secretpath", "azure7731key",
                 "p@ss/w0rd-7731")
LOOKALIKES = {"AUTH_MODE": "succeeded", "MY_KEY": "reward"}


@pytest.fixture(scope="session")
def sealed_smoke(tmp_path_factory) -> dict:
    """``{"signed": run dir, "unsigned": run dir, "key": private key path, "pub": public key path}``; the run
    had SECRETS and LOOKALIKES in its environment."""
    root = tmp_path_factory.mktemp("sealed-smoke")
    made = os.environ.get("KIT_TEST_SEALED_SMOKE")   # edit loop only: a dir this fixture made before (keys/, ws/)
    if made:
        priv, pub, signed = Path(made, "keys", "seal.pem"), Path(made, "keys", "seal.pub"), Path(made, "ws", "runs", "tamper-src")
    else:
        priv, pub = write_keypair(root / "keys")
        proc = kit("run", "--arm", "smoke", "--rollouts", "1", "--run-id", "tamper-src", "--allow-dirty",
                   "--sign-key", str(priv), env={"KIT_WORKSPACE": str(root / "ws"), **SECRETS, **LOOKALIKES})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        signed = root / "ws" / "runs" / "tamper-src"
    unsigned = root / "unsigned" / "runs" / "tamper-src"
    shutil.copytree(signed, unsigned)
    (unsigned / E.SEAL).unlink()
    for path in [unsigned, *unsigned.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWUSR)
    (unsigned.parent / E.ID_REGISTRY).write_text("tamper-src\n")
    report = json.loads((unsigned / E.VALIDATION).read_text())
    E.seal_run_dir(unsigned, run_id="tamper-src", validation_passed=report["passed"],
                   gate_set_version=report["gate_set_version"])
    return {"signed": signed, "unsigned": unsigned, "key": priv, "pub": pub}
