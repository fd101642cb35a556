"""The `kit` command line: a click group whose subcommands are imported only when used.

Each command lives in ``kit/cli/<name>.py`` as a click command (or group) called ``command``.
The table below gives its one-line purpose, so ``kit --help`` never imports a command module,
and never torch, ray or docker. Errors derived from KitError become one line on stderr and
their exit code (1 check failed, 2 bad input). A file-system error that escapes a command becomes
one line naming the path: exit 2 when the path cannot be used as given (missing, not permitted,
read-only, of the wrong kind), 1 otherwise (a full disk, an I/O error). A third-party package of an
extra this install lacks (``pip install rlk-kit`` holds only what kit verify, compare and plan need)
is one line naming the extra, exit 2. Any other exception is a bug:
one line starting ``kit: internal error`` names the crash report written (kit/cli/_crash.py), exit 1.
"""

from __future__ import annotations

import errno
import os
import importlib
import sys

import click

from kit import __version__
from kit.model.errors import KitError

# name -> (module, one-line purpose). Order is the pipeline order shown by --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("kit.cli.verify", "Check stack/arm locks, images or sealed run dirs; exit 1 on any failure."),
    "compare": ("kit.cli.compare", "Classify every difference between two arms or runs as declared or uncontrolled."),
    "keys": ("kit.cli.keys", "Make a key pair to sign runs and builds with (ECDSA P-256 or ed25519)."),
    "lock": ("kit.cli.lock", "Hash-lock every package of each stack's platforms (uv); --check reports drift."),
    "plan": ("kit.cli.plan", "Resolve an arm into topology, train command, Ray job and the image it needs."),
    "build": ("kit.cli.build", "Build the pinned image of a stack for cuda, rocm or cpu on a Docker engine."),
    "probe": ("kit.cli.probe", "Report the observed software identity of wherever it runs."),
    "doctor": ("kit.cli.doctor", "Preflight the host: engine, GPUs, shm, disk, Ray, image and inputs."),
    "prepare": ("kit.cli.prepare", "Prepare the prompt data and hash the model checkpoint, with provenance."),
    "run": ("kit.cli.run", "Run an arm locally, in its container or on a Ray cluster, and seal the evidence."),
    "cluster": ("kit.cli.cluster", "Start a local Ray cluster of pinned containers; render Slurm and KubeRay jobs."),
    "suite": ("kit.cli.suite", "Run the module matrix M000..M111 and attribute mismatches per module."),
    "claim": ("kit.cli.claim", "Seal a claim before its runs; evaluate exactly its declared test into a sealed verdict."),
    "analyze": ("kit.cli.analyze", "Performance decomposition, statistics, convergence tables and figures."),
    "report": ("kit.cli.report", "One self-contained HTML page a reviewer reads: a claim's verdict, a comparison or a run."),
    "reproduce": ("kit.cli.reproduce", "Re-run a sealed run from its manifest and compare its records bitwise."),
    "export": ("kit.cli.export", "Export runs to an MLflow tracking store (params, metrics, tags, evidence)."),
    "kernels": ("kit.cli.kernels", "Conformance oracle of the strict and production operators."),
}


# The extras of pyproject.toml: which one brings a module a command imports on first use.
EXTRA_OF_MODULE = {"torch": "run", "ray": "run", "docker": "run", "pyarrow": "run", "uv": "run", "numpy": "run",
                   "triton": "run", "matplotlib": "analysis", "mlflow": "export", "kubernetes_validate": "cluster"}
EXTRA_OF_COMMAND = {"analyze": "analysis", "export": "export"}
# Commands whose every use needs these: checked before they start (their worker processes would
# otherwise each fail on the import), unless only --help is asked for.
COMMAND_NEEDS = {"analyze": ("numpy", "matplotlib"), "export": ("mlflow",)}


def missing_for(command: str | None, argv: list[str]) -> str | None:
    """The one line for a command run without its extra installed, None when all it needs is there."""
    if command not in COMMAND_NEEDS or any(a in ("--help", "-h") for a in argv):
        return None
    import importlib.util

    for module in COMMAND_NEEDS[command]:
        if importlib.util.find_spec(module) is None:
            return missing_extra_message(ModuleNotFoundError(name=module), command)
    return None


def missing_extra_message(exc: ModuleNotFoundError, command: str | None) -> str | None:
    """``kit analyze needs numpy, which this install lacks: pip install 'rlk-kit[analysis]'``; None for a
    module no extra brings (a bug, not an install choice)."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF_MODULE:
        return None
    extra = EXTRA_OF_COMMAND.get(command or "", EXTRA_OF_MODULE[top])
    return (f"kit {command or ''} needs {top}, which this install lacks: pip install 'rlk-kit[{extra}]' "
            "(or 'rlk-kit[all]'); the base install holds kit verify, kit compare and kit plan").replace("kit  ", "kit ")


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def format_commands(self, ctx, formatter):
        rows = [(name, purpose) for name, (_, purpose) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        # The command line as parsed (CliRunner's and main(args=...) are not sys.argv), for a crash report.
        protected = getattr(ctx, "_protected_args", None)
        argv = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        missing = missing_for(argv[0] if argv else None, argv)
        if missing:
            click.echo(missing, err=True)
            ctx.exit(2)
        try:
            return super().invoke(ctx)
        except KitError as exc:
            click.echo(f"kit: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except OSError as exc:
            if isinstance(exc, BrokenPipeError):
                raise        # a closed pipe: click and Python end quietly
            if exc.errno in _FULL_ERRNOS:   # a full disk is the host's state, not a bug: say where, what helps
                where = os_error_message(exc) if exc.filename else f"{exc.strerror} (workspace {_workspace_of(argv)})"
                click.echo(f"kit: {where}: the file system is full; free space there (or give --workspace on another "
                           "file system) and run again; what was written is kept, and nothing unfinished is sealed",
                           err=True)
                ctx.exit(2)
            if exc.filename is None:
                _last_resort(ctx, exc, argv)   # not about a path the user can fix
            click.echo(f"kit: {os_error_message(exc)}", err=True)
            ctx.exit(2 if exc.errno in _UNUSABLE_PATH_ERRNOS else 1)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise            # click's own: usage errors (2), ctx.exit, Ctrl-C at a prompt
        except ModuleNotFoundError as exc:
            message = missing_extra_message(exc, argv[0] if argv else None)
            if message is None:
                _last_resort(ctx, exc, argv)
            click.echo(message, err=True)
            ctx.exit(2)
        except Exception as exc:
            _last_resort(ctx, exc, argv)


def _workspace_of(argv: list[str]) -> str:
    """The workspace a command line names (--workspace, else KIT_WORKSPACE, else the default)."""
    for i, arg in enumerate(argv):
        if arg == "--workspace" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--workspace="):
            return arg.split("=", 1)[1]
    return os.environ.get("KIT_WORKSPACE") or ".workspace"


def _last_resort(ctx, exc: BaseException, argv: list[str]):
    """Last resort: a bug becomes one line naming a crash report, never a traceback; exit 1."""
    try:
        from kit.cli._crash import print_crash     # only on a crash: keeps `kit --help` fast
        print_crash(exc, argv)
    except Exception as err:     # the report itself failed: still one line, still exit 1
        click.echo(f"kit: internal error ({type(exc).__name__}: {exc}); no crash report ({type(err).__name__}: {err})",
                   err=True)
    ctx.exit(1)


_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# A path the user (or a file they named) pointed at that cannot be used as it is.
_UNUSABLE_PATH_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EROFS,
                         errno.EEXIST, errno.ENAMETOOLONG}


def os_error_message(exc: OSError) -> str:
    """``/proc/nope: No such file or directory`` (both paths for a rename or link)."""
    where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
    return f"{where}: {exc.strerror or exc}"


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kit")
def cli():
    """rlk-kit: pinned stacks, sealed evidence, controlled comparisons.

    \b
    Pipeline:  manifests/*.json --build--> image --run--> run dir --verify--> sealed bundle --analyze--> report
    \b
    Examples:
      kit run --arm smoke                         # the embedded CPU smoke arm, sealed
      kit verify manifests/*.json                 # schema + semantic rules over every lock
      kit compare manifests/G10.json manifests/G11.json
      kit plan --arm consistency --tp-size 2 --cp-size 4 --json
    """


def main() -> None:
    cli(prog_name="kit")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
