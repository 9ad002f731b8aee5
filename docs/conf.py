"""Sphinx configuration of the django-outboxes docs (build: bash scripts/docs.sh)."""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# The version is read from the package, and the reference pages are generated from the
# app's settings and commands: Django is set up first (the test settings: SQLite).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("OUTBOX_TEST_DB", "sqlite")
import django  # noqa: E402

django.setup()

import outbox  # noqa: E402

project = "django-outboxes"
author = "django-outboxes developers"
copyright = "django-outboxes developers"
release = outbox.__version__
version = release

extensions = [
    "myst_parser",
    "outbox_reference",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "tutorial_project", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

default_role = "py:obj"


html_theme = "furo"
html_title = f"django-outboxes {release}"
html_static_path: list[str] = []
