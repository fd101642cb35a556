"""The environment is recorded by allow-list: no secret value and no URL password reaches any file of a
run dir, and values that merely look like secrets' never rewrite the engine's log or the run's status."""

from __future__ import annotations

import json

from sealed_run import LOOKALIKES, SECRET_VALUES, SECRETS, sealed_smoke  # noqa: F401  (a session fixture)

from kit.evidence.environment import record_host, redact_url_passwords, secret_names


def test_no_secret_value_in_any_file_of_the_run_dir(sealed_smoke):
    run_dir = sealed_smoke["signed"]
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            leaked = [v for v in SECRET_VALUES if v.encode() in data]
            assert not leaked, (path, leaked)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    host = manifest["environment"]["host"]
    assert not (set(SECRETS) - {"HTTPS_PROXY"}) & set(host) and host["HTTPS_PROXY"] == "http://<redacted>@127.0.0.1:9"
    assert set(SECRETS) - {"HTTPS_PROXY"} <= set(manifest["environment"]["redacted_names"])
    assert "AUTH_MODE" not in host and "MY_KEY" not in host and "HOME" not in host


def test_lookalike_values_never_rewrite_the_log_or_the_status(sealed_smoke):
    run_dir = sealed_smoke["signed"]
    log = (run_dir / "run.log").read_text()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "succeeded" and "<redacted" not in log
    assert "raw_reward" in log and "<redacted" not in (run_dir / "kit.log").read_text()
    assert LOOKALIKES["MY_KEY"] in log


def test_allow_list_rules():
    assert record_host({"CUDA_VISIBLE_DEVICES": "0", "DB_PASS": "x", "NCCL_DEBUG": "INFO", "RAY_AUTH_TOKEN": "t"}) == \
        {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "RAY_AUTH_TOKEN": "<redacted>"}
    assert redact_url_passwords("postgres://u:a/b@c@db:5432/x") == "postgres://<redacted>@db:5432/x"
    assert secret_names({"PWD": "/", "MYSQL_PWD": "p", "SENTRY_DSN": "d"}) == ["MYSQL_PWD", "SENTRY_DSN"]
