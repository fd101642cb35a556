"""The last-resort handler: an unexpected exception becomes one line naming a crash report, exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kit.cli import COMMANDS, cli
from kit.cli._crash import PREFIX, redacted_argv
from kit.model.documents import schema_problems


@pytest.fixture
def boom(monkeypatch):
    """A test-only command ``kit boom`` whose behaviour each test picks."""
    behaviour = {"raise": ZeroDivisionError("division by zero")}

    @click.command()
    @click.option("--workspace")
    @click.option("--token")
    @click.argument("rest", nargs=-1)
    def command(workspace, token, rest):
        raise behaviour["raise"]

    module = type(sys)("kit_test_boom")
    module.command = command
    monkeypatch.setitem(sys.modules, "kit_test_boom", module)
    monkeypatch.setitem(COMMANDS, "boom", ("kit_test_boom", "Raise (test only)."))
    monkeypatch.delenv("KIT_CRASH_DIR", raising=False)
    monkeypatch.delenv("KIT_CRASH_TRACEBACK", raising=False)
    return behaviour


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


def test_a_bug_is_one_line_naming_a_valid_crash_report(boom, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue")
    result = invoke("boom", "--workspace", str(tmp_path / "ws"), "--token", "t0psecret",
                    "https://user:pa55word@host/x", "hf_supersecretvalue")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), result.output
    assert "ZeroDivisionError: division by zero" in lines[0]
    reports = list((tmp_path / "ws" / "crashes").glob("*.json"))
    assert len(reports) == 1 and str(reports[0]) in lines[0]
    assert reports[0].name.endswith(f"-{os.getpid()}.json")
    doc = json.loads(reports[0].read_text())
    assert schema_problems(doc, "crash-report") == []
    assert "ZeroDivisionError" in doc["traceback"] and "test_crash_handler.py" in doc["traceback"]
    assert doc["exception"] == {"type": "ZeroDivisionError", "message": "division by zero"}
    text = json.dumps(doc)
    for secret in ("t0psecret", "pa55word", "hf_supersecretvalue"):
        assert secret not in text
    assert doc["argv"][:3] == ["boom", "--workspace", str(tmp_path / "ws")]
    from kit import __version__
    assert doc["kit_version"] == __version__


def test_an_unwritable_workspace_falls_back_to_the_temp_dir(boom, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    result = invoke("boom", f"--workspace={blocker}")
    assert result.exit_code == 1 and result.stderr.startswith(PREFIX)
    reports = list((tmp_path / "tmp" / "kit-crashes").glob("*.json"))
    assert len(reports) == 1 and str(reports[0]) in result.stderr


def test_kit_crash_dir_and_traceback_variables(boom, tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CRASH_DIR", str(tmp_path / "crashes"))
    monkeypatch.setenv("KIT_CRASH_TRACEBACK", "1")
    boom["raise"] = OSError("no path in this one")       # an OSError without a filename is a bug too
    result = invoke("boom")
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and result.stderr.strip().splitlines()[-1].startswith(PREFIX)
    assert len(list((tmp_path / "crashes").glob("*.json"))) == 1


@pytest.mark.parametrize("raised, code", [(click.UsageError("bad"), 2), (click.exceptions.Exit(3), 3),
                                          (click.Abort(), 1), (SystemExit(4), 4)])
def test_clicks_exceptions_and_exits_pass_through(boom, tmp_path, monkeypatch, raised, code):
    monkeypatch.setenv("KIT_CRASH_DIR", str(tmp_path / "crashes"))
    boom["raise"] = raised
    result = invoke("boom")
    assert result.exit_code == code and PREFIX not in result.stderr
    assert not (tmp_path / "crashes").exists()


def test_kit_errors_keep_their_one_line(boom, tmp_path, monkeypatch):
    from kit.model.errors import BadInput
    monkeypatch.setenv("KIT_CRASH_DIR", str(tmp_path / "crashes"))
    boom["raise"] = BadInput("x.json: bad")
    result = invoke("boom")
    assert result.exit_code == 2 and result.stderr.strip() == "kit: x.json: bad"


def test_ctrl_c_is_not_a_crash(tmp_path):
    # A real process: KeyboardInterrupt passes the handler (exit 130 by click, or Python's own), no report.
    code = ("import sys, click; from kit.cli import COMMANDS, cli; m = type(sys)('m');"
            "m.command = click.command()(lambda: (_ for _ in ()).throw(KeyboardInterrupt()));"
            "sys.modules['m'] = m; COMMANDS['boom'] = ('m', 'x'); cli(['boom'], prog_name='kit')")
    env = dict(os.environ, KIT_CRASH_DIR=str(tmp_path / "crashes"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0 and PREFIX not in result.stderr
    assert not (tmp_path / "crashes").exists()


def test_redacted_argv():
    assert redacted_argv(["--api-key=abcdef", "--password", "x", "s3://u:longpass@h/b", "plain"], env={}) == \
        ["--api-key=<redacted>", "--password", "<redacted>", "s3://u:<redacted>@h/b", "plain"]


def test_the_report_folder_defaults_to_kit_workspace(boom, tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_WORKSPACE", str(tmp_path / "env-ws"))
    result = invoke("boom")
    assert result.exit_code == 1
    assert len(list(Path(tmp_path / "env-ws" / "crashes").glob("*.json"))) == 1
