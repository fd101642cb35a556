"""`kit report`: one self-contained HTML page a reviewer reads, for a verdict, a comparison or a run."""

from __future__ import annotations

from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.model.errors import BadInput
from kit.report.build import page_for
from kit.report.page import render

PAGE = "index.html"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("args", metavar="ARGS", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder for index.html (created when missing; an existing index.html is never replaced).")
@click.option("--json", "as_json", is_flag=True, help="Print {\"schema\": \"rlk-kit/report/v1\", \"page\", \"verdict\"}.")
def command(args: tuple[Path, ...], out: Path, as_json: bool):
    """Write one self-contained HTML page (no network, no external asset; figures embedded) for a claim's
    verdict (kit claim evaluate), a comparison (two run dirs) or a single run: the verdict banner, the
    claim and its rule, the identity table with every difference declared or uncontrolled, the gates of
    each run, the statistics with their CIs, the figures, the monitors, and the commands that re-check it.
    Every run is re-verified while the page is made. Exit 0 written, 2 bad input.

    \b
    Examples:
      kit report smoke-mismatch.verdict.json --out report
      kit report .workspace/runs/r1 .workspace/runs/r2 --out report-pair
      kit report .workspace/runs/r1 --out report-r1
    """
    page = page_for(list(args))
    target = out / PAGE
    if target.exists():
        raise BadInput(f"--out {out}: {PAGE} exists; a page is never replaced, give another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(target, "x", encoding="utf-8") as fh:
            fh.write(render(page))
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot write {PAGE} ({exc.strerror or exc}); give a writable folder") from None
    if as_json:
        emit_json({"schema": "rlk-kit/report/v1", "page": str(target), "verdict": page.banner.verdict})
        return
    click.echo(f"{page.banner.verdict}: {page.title}")
    click.echo(f"page  {target}")
