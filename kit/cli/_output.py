"""Small printing helpers shared by the command modules."""

from __future__ import annotations

import click

from kit.model.documents import dumps_pretty, require_valid


def emit_json(doc: dict) -> None:
    """Print a document after checking it against its schema: the kit never prints an invalid document."""
    require_valid(doc, "output document")
    click.echo(dumps_pretty(doc), nl=False)


def no_empty_paths(ctx, param, values):
    """A click callback for path arguments: an empty string is refused by name (``Path("")`` is ".", which
    would then be judged, and named, instead of what the user typed)."""
    if any(not str(v).strip() for v in values or ()):
        raise click.BadParameter("an empty path; give a run directory or a file", ctx=ctx, param=param)
    return values
