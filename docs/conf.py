"""Sphinx configuration of Sluice's documentation site (Furo theme, pages in Markdown through MyST).

Build: ``./dev docs`` (generates the reference pages, builds with warnings as errors, serves on
http://127.0.0.1:8000); ``./dev docs --check`` builds only. CI builds it in tests/docs/test_site.py.
"""

from __future__ import annotations

project = "Sluice"
author = "The Sluice developers"
copyright = "2026, the Sluice developers"  # noqa: A001 - Sphinx's name

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "tools", "Thumbs.db", ".DS_Store"]

# Headings up to level 3 get anchors, so [text](page.md#a-heading) links are checked (a missing one warns,
# and the build treats warnings as errors).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

html_theme = "furo"
html_title = "Sluice"
html_static_path = ["_static"]
html_css_files = ["sluice.css"]
html_theme_options = {
    "sidebar_hide_name": False,
    "navigation_with_keys": True,
}
pygments_style = "friendly"
pygments_dark_style = "monokai"
