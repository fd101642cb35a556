"""The last-resort handler: an exception the kit did not expect becomes one line and a crash report.

The line always starts with ``kit: internal error`` (tests count it as a failure) and names the report,
``<workspace>/crashes/<UTC time>-<pid>.json`` (schema ``crash-report/v1``: traceback, command line with
secret-looking values redacted, kit version). The workspace is ``--workspace`` on the command line, else
``$KIT_WORKSPACE``, else ``./.workspace``; ``$KIT_CRASH_DIR`` overrides the folder, and when none can be
written the report goes to the temp dir's ``kit-crashes/``. ``KIT_CRASH_TRACEBACK=1`` also prints the
traceback on stderr. Example::

    kit: internal error (ZeroDivisionError: division by zero); crash report: .workspace/crashes/20261205T154501Z-4242.json
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

from kit import __version__
from kit.evidence.redact import REDACTED, Redactor, is_secret_name, url_passwords
from kit.model.documents import schema_id, write_new_document
from kit.model.errors import BadInput

PREFIX = "kit: internal error"
SCHEMA = schema_id("crash-report")
MAX_TRACEBACK_CHARS = 200_000


def redacted_argv(argv: list[str], env=os.environ) -> list[str]:
    """``['run', '--token', 'abc123456']`` -> ``['run', '--token', '<redacted>']``: values of secret-named
    flags, passwords in URLs and the values of secret-named environment variables are replaced."""
    scrub = Redactor.from_env(env)
    out: list[str] = []
    secret_next = False
    for arg in argv:
        if secret_next:
            out.append(REDACTED)
            secret_next = False
            continue
        if arg.startswith("-") and is_secret_name(arg.split("=", 1)[0]):
            if "=" in arg:
                arg = arg.split("=", 1)[0] + "=" + REDACTED
            else:
                secret_next = True
        for password in url_passwords(arg):
            arg = arg.replace(password, REDACTED)
        out.append(scrub.text(arg))
    return out


def _crash_dirs(argv: list[str]) -> list[Path]:
    dirs = []
    if os.environ.get("KIT_CRASH_DIR"):
        dirs.append(Path(os.environ["KIT_CRASH_DIR"]))
    workspace = None
    for i, arg in enumerate(argv):
        if arg == "--workspace" and i + 1 < len(argv):
            workspace = argv[i + 1]
        elif arg.startswith("--workspace="):
            workspace = arg.split("=", 1)[1]
    workspace = workspace or os.environ.get("KIT_WORKSPACE") or ".workspace"
    dirs.append(Path(workspace) / "crashes")
    dirs.append(Path(tempfile.gettempdir()) / "kit-crashes")
    return dirs


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:         # the folder was removed under the command
        return ""


def report_crash(exc: BaseException, argv: list[str] | None = None) -> str:
    """Write the crash report of ``exc`` and return the one line to print (the report's path, or why none)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    scrub = Redactor.from_env(os.environ)
    doc = {"schema": SCHEMA, "kit_version": __version__,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pid": os.getpid(),
           "cwd": _cwd(), "argv": redacted_argv(argv),
           "python": sys.version.split()[0], "platform": platform.platform(),
           "exception": {"type": type(exc).__qualname__, "message": scrub.text(str(exc))[:2000]},
           "traceback": scrub.text(text)[-MAX_TRACEBACK_CHARS:]}
    summary = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    summary = scrub.text(summary)
    name = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.json"
    why = "no folder given"
    for folder in _crash_dirs(argv):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = _write_unique(folder, name, doc)
        except Exception as err:     # any folder that cannot take it: try the next one
            why = f"{folder}: {getattr(err, 'strerror', None) or err}"
            continue
        return f"{PREFIX} ({summary}); crash report: {path}; please report it with that file"
    return f"{PREFIX} ({summary}); no crash report could be written ({why})"


def _write_unique(folder: Path, name: str, doc: dict) -> Path:
    """``name``, else ``<stem>-2.json`` … when a report of the same second and process is there already."""
    stem = name[:-len(".json")]
    for n in range(1, 100):
        path = folder / (name if n == 1 else f"{stem}-{n}.json")
        if not path.exists():
            try:
                return write_new_document(path, doc, expected="crash-report")
            except BadInput:
                if not path.exists():
                    raise          # not a race with another report: the folder refused it
    raise OSError(f"{folder}: 99 crash reports of this second and process already")


def print_crash(exc: BaseException, argv: list[str] | None = None) -> None:
    line = report_crash(exc, argv)
    if os.environ.get("KIT_CRASH_TRACEBACK") == "1":
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(line, file=sys.stderr, flush=True)
