"""The steps an instance took, drawn server-side as SVG (no script, no external asset):
one box per timeline item, top to bottom, joined by arrows, coloured by outcome."""

from __future__ import annotations

from markupsafe import Markup, escape

from kenning_console.timeline import Item

ROW = 44
BOX_HEIGHT = 30
WIDTH = 560
LEFT = 8
FILL = {"ok": "#e3f4e7", "bad": "#fde8e9", "wait": "#fff3d6", "": "#eceff3"}
STROKE = {"ok": "#1a6b2f", "bad": "#a1151d", "wait": "#7a4b00", "": "#3b4450"}
ICON = {
    "activity": "▶",
    "event": "✉",
    "sent": "➚",
    "timer": "⏱",
    "timeout": "⏱",
    "wait": "…",
    "compensation": "↺",
    "marker": "⚑",
}
MAX_LABEL = 60


def _label(item: Item) -> str:
    text = f"{ICON.get(item.kind, '•')} {item.name} — {item.outcome}"
    if item.attempts and item.attempts > 1:
        text += f" ({item.attempts} attempts)"
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def steps_svg(items: list[Item]) -> Markup:
    """``<svg>`` with the steps in order; labelled for screen readers."""
    if not items:
        return Markup('<p class="muted">No steps recorded yet.</p>')
    height = ROW * len(items) + 4
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-labelledby="diagram-title">',
        f'<title id="diagram-title">{len(items)} steps: '
        + str(escape("; ".join(f"{item.name} {item.outcome}" for item in items)))
        + "</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="5" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#4d5560"/></marker></defs>',
    ]
    for index, item in enumerate(items):
        y = 2 + index * ROW
        if index:
            parts.append(
                f'<line x1="{LEFT + 20}" y1="{y - ROW + BOX_HEIGHT}" x2="{LEFT + 20}" y2="{y - 2}" '
                'stroke="#4d5560" stroke-width="1.5" marker-end="url(#arrow)"/>'
            )
        parts.append(
            f'<rect x="{LEFT}" y="{y}" width="{WIDTH - 2 * LEFT}" height="{BOX_HEIGHT}" rx="6" '
            f'fill="{FILL[item.tone]}" stroke="{STROKE[item.tone]}" stroke-width="1.5"'
            + (' stroke-dasharray="5 3"' if item.outcome in ("waiting", "registered", "pending") else "")
            + "/>"
        )
        parts.append(
            f'<text x="{LEFT + 12}" y="{y + 20}" font-family="system-ui, sans-serif" font-size="14" '
            f'fill="#1b1f24">{escape(_label(item))}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
