"""report.html from report.md: escaped, with a Content-Security-Policy that runs no script."""

from __future__ import annotations

import html as html_lib

# The report runs no script and loads nothing but its own figures: a name imported from someone else's
# table cannot run code in the reader's browser even if it slipped past the escaping below.
CSP = "default-src 'none'; script-src 'none'; object-src 'none'; img-src 'self' data: file:; style-src 'unsafe-inline'"


def render_html(md_text: str, title: str) -> str:
    """report.html from report.md: raw HTML in the Markdown (a `<script>` or `<img onerror=…>` in an arm,
    factor or rung name, a note, a warning) is written as text, never as markup."""
    import markdown

    conv = markdown.Markdown(extensions=["tables"])
    conv.preprocessors.deregister("html_block")  # no block of raw HTML passes through
    conv.inlinePatterns.deregister("html")  # nor an inline tag: '<' and '>' are escaped as text
    body = conv.convert(md_text)
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
            f"<title>{html_lib.escape(title)}</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>" + body +
            "</body></html>")
