"""The vocabulary of the dashboard's page data (:mod:`.pages`): cells, tables and charts, the numbers' formats, and
the HTML of table rows (what the templates print and what ``static/dashboard.js`` builds from the same JSON).

A cell is a string, or ``{"t": text, "href": link, "c": css classes}``, or a list of those (a ``br`` class ends a
line). A table is ``{"columns", "rows", "empty"}``; a chart ``{"title", "unit", "labels", "x", "y"}`` with ``x``
in Unix seconds and one list per series in ``y`` (``None`` where nothing is known or shown).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from markupsafe import Markup, escape

from corral.core.job import FULL_GPU_MILLI

Cell = str | dict[str, str] | list[dict[str, str]]
Data = dict[str, Any]


# -- cells, tables, charts --------------------------------------------------------------------------------------------
def link(text: str, href: str, css: str = "") -> dict[str, str]:
    cell = {"t": text, "href": href}
    if css:
        cell["c"] = css
    return cell


def badge(text: str, css: str) -> dict[str, str]:
    return {"t": text, "c": f"badge {css}"}


def pct(ratio: float | None) -> str:
    return "-" if ratio is None or math.isnan(ratio) else f"{ratio * 100:.0f}%"


def gib(mib: float | None) -> str:
    return "-" if mib is None or math.isnan(mib) else f"{mib / 1024:.1f} GiB"


def gpus(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:g}"


def share(milli: int) -> str:
    return "1 GPU" if milli == FULL_GPU_MILLI else f"{milli / 10:g}%"


def _num(value: float, digits: int = 3) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else round(value, digits)


def chart(title: str, unit: str, labels: Sequence[str], x: Sequence[float], y: Sequence[Sequence[float]]) -> Data:
    return {
        "title": title,
        "unit": unit,
        "labels": list(labels),
        "x": [round(t, 1) for t in x],
        "y": [[_num(v) for v in column] for column in y],
    }


def table(columns: Sequence[str], rows: list[list[Cell]], empty: str = "nothing to show") -> Data:
    return {"columns": list(columns), "rows": rows, "empty": empty}


def job_cell(job_id: str) -> dict[str, str]:
    return link(job_id, f"/jobs/{job_id}", "mono")


def kind(opportunistic: bool) -> dict[str, str]:
    return badge("opportunistic", "opp") if opportunistic else badge("guaranteed", "gua")


# -- HTML --------------------------------------------------------------------------------------------------------------
def html_cell(cell: Cell, root: str = "") -> str:
    """A table cell (:data:`Cell`) as HTML, every text escaped: what ``dashboard.js`` builds from the same
    cell. Plain strings and ``escape`` rather than a Jinja macro: a queue page has thousands of cells."""
    if isinstance(cell, str):
        return str(escape(cell))
    parts = [cell] if isinstance(cell, dict) else cell
    out = []
    for p in parts:
        css = p.get("c", "")
        attr = f' class="{escape(css)}"' if css else ""
        text = escape(p.get("t", ""))
        if "href" in p:
            out.append(f'<a href="{escape(root + p["href"])}"{attr}>{text}</a>')
        else:
            out.append(f"<span{attr}>{text}</span>")
        if len(parts) > 1:
            out.append("<br>" if "br" in css.split() else " ")
    return "".join(out)


def html_rows(table: dict[str, Any], root: str = "") -> Markup:
    """A table's body rows as HTML, in one string (a Jinja loop over thousands of cells is several times slower)."""
    rows = table["rows"]
    if not rows:
        return Markup(f'<tr><td colspan="{len(table["columns"])}" class="empty">{escape(table["empty"])}</td></tr>')
    return Markup("\n".join("<tr>" + "".join(f"<td>{html_cell(c, root)}</td>" for c in row) + "</tr>" for row in rows))
