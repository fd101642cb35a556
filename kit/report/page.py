"""The reviewer's page: one self-contained HTML file (no network, no external asset; images as data URIs).

Pure: a :class:`Page` (a banner and sections of tables, paragraphs, figures and commands) becomes HTML.
It reads on a laptop and a narrow screen (tables scroll sideways inside their box, figures scale to the
width) and prints (no backgrounds lost, no section split across pages where avoidable). Example::

    html = render(Page("claim smoke-mismatch", Banner("supported", "0 mismatched tokens ..."), [
        Section("Claim", [Paragraph("R/R removes ...")])]))
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

TONES = {"supported": "good", "controlled": "good", "succeeded": "good", "passed": "good", "not supported": "bad",
         "not controlled": "bad", "failed": "bad", "inconclusive": "warn", "incomplete": "muted", "missing": "bad",
         "not_applicable": "muted"}


@dataclass(frozen=True)
class Banner:
    verdict: str
    detail: str


@dataclass(frozen=True)
class Table:
    id: str
    caption: str
    header: tuple[str, ...]
    rows: tuple[tuple, ...]
    # cells of a column whose value is one of TONES' keys are coloured by it
    toned_columns: tuple[int, ...] = ()


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Figure:
    id: str
    png: bytes
    caption: str


@dataclass(frozen=True)
class Commands:
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    title: str
    parts: list = field(default_factory=list)


@dataclass(frozen=True)
class Page:
    title: str
    banner: Banner
    sections: list
    footer: str = ""


CSS = """
:root { --good:#0b6e2e; --bad:#b00020; --warn:#8a5a00; --muted:#555; --line:#d0d4da; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:#1b1f24; margin:0; }
main { max-width: 1100px; margin: 0 auto; padding: 1rem; }
h1 { font-size: 1.4rem; margin: .2rem 0 1rem; overflow-wrap: anywhere; }
h2 { font-size: 1.15rem; margin: 1.6rem 0 .5rem; border-bottom: 1px solid var(--line); padding-bottom: .2rem; }
.banner { border-radius: 6px; padding: .8rem 1rem; color: #fff; margin-bottom: 1rem; }
.banner .verdict { font-size: 1.6rem; font-weight: 700; text-transform: uppercase; letter-spacing: .03em; }
.banner.good { background: var(--good); } .banner.bad { background: var(--bad); }
.banner.warn { background: var(--warn); } .banner.muted { background: var(--muted); }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: .4rem 0 1rem; }
table { border-collapse: collapse; width: 100%; font-size: .88rem; }
caption { text-align: left; font-weight: 600; padding: .3rem 0; }
th, td { border: 1px solid var(--line); padding: .3rem .5rem; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f2f4f7; }
td.good { color: var(--good); font-weight: 600; } td.bad { color: var(--bad); font-weight: 600; }
td.warn { color: var(--warn); font-weight: 600; } td.muted { color: var(--muted); }
figure { margin: .5rem 0 1rem; } figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { font-size: .85rem; color: var(--muted); }
pre { background: #f6f8fa; border: 1px solid var(--line); padding: .6rem; overflow-x: auto; font-size: .85rem; }
footer { color: var(--muted); font-size: .8rem; margin: 2rem 0 1rem; }
@media (max-width: 600px) { body { font-size: 14px; } main { padding: .6rem; } .banner .verdict { font-size: 1.3rem; } }
@media print {
  body { font-size: 11pt; } main { max-width: none; padding: 0; }
  .banner, td, th { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  .scroll { overflow: visible; } section, figure, table { break-inside: avoid; } a { color: inherit; }
}
"""

# Marks each image once it has decoded, so a headless browser's DOM says whether every figure loaded.
SCRIPT = """window.addEventListener('load', function () {
  document.querySelectorAll('img').forEach(function (img) {
    img.setAttribute('data-loaded', img.complete && img.naturalWidth > 0 ? 'yes' : 'no');
  });
  document.body.setAttribute('data-ready', 'yes');
});"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _tone(value) -> str:
    return TONES.get(str(value).lower(), "")


def _table(t: Table) -> str:
    head = "".join(f"<th scope=\"col\">{_e(h)}</th>" for h in t.header)
    body = []
    for row in t.rows:
        cells = []
        for i, cell in enumerate(row):
            tone = _tone(cell) if i in t.toned_columns else ""
            cells.append(f"<td class=\"{tone}\">{_e(cell)}</td>" if tone else f"<td>{_e(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f"<tr><td colspan=\"{len(t.header)}\">none</td></tr>")
    return (f"<div class=\"scroll\"><table id=\"{_e(t.id)}\"><caption>{_e(t.caption)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def _part(part) -> str:
    if isinstance(part, Table):
        return _table(part)
    if isinstance(part, Paragraph):
        return f"<p>{_e(part.text)}</p>"
    if isinstance(part, Figure):
        data = base64.b64encode(part.png).decode("ascii")
        return (f"<figure id=\"{_e(part.id)}\"><img alt=\"{_e(part.caption)}\" src=\"data:image/png;base64,{data}\">"
                f"<figcaption>{_e(part.caption)}</figcaption></figure>")
    if isinstance(part, Commands):
        return "<pre><code>" + "\n".join(_e(line) for line in part.lines) + "</code></pre>"
    raise TypeError(f"not a page part: {type(part).__name__}")


def render(page: Page) -> str:
    tone = _tone(page.banner.verdict) or "muted"
    sections = "".join(f"<section><h2>{_e(s.title)}</h2>{''.join(_part(p) for p in s.parts)}</section>"
                       for s in page.sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(page.title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{_e(page.title)}</h1>"
            f"<div class=\"banner {tone}\" id=\"verdict\"><div class=\"verdict\">{_e(page.banner.verdict)}</div>"
            f"<div>{_e(page.banner.detail)}</div></div>{sections}"
            f"<footer>{_e(page.footer)}</footer></main><script>{SCRIPT}</script></body></html>\n")
