"""Small printing helpers shared by the command modules."""

from __future__ import annotations

import click

from kit.model.documents import dumps_pretty, require_valid


def emit_json(doc: dict) -> None:
    """Print a document after checking it against its schema: the kit never prints an invalid document."""
    require_valid(doc, "output document")
    click.echo(dumps_pretty(doc), nl=False)
