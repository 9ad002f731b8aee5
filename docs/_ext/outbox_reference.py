"""Reference tables generated from the code, so the docs cannot drift from it.

- ``{outbox-settings}``: every ``OUTBOX_*`` setting of `outbox.conf.SETTINGS`, with its
  type, default and meaning.
- ``{outbox-command} NAME``: the ``--help`` of a management command, from its parser.

The data functions import nothing from Sphinx, so the test suite can call them
(`tests/test_docs_reference.py`) without the docs extra installed.
"""

from __future__ import annotations

import os
from typing import Any


def settings_rows() -> list[tuple[str, str, str, str]]:
    """(name, accepted values, default, meaning) of every setting, in declaration order."""
    from outbox.conf import SETTINGS

    return [
        (setting.setting_name, setting.expected, repr(setting.default), setting.doc)
        for setting in SETTINGS.values()
    ]


def command_help(name: str) -> str:
    """``manage.py NAME --help`` of one command, at a fixed width."""
    from django.core.management import load_command_class

    parser = load_command_class("outbox", name).create_parser("manage.py", name)
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "90"  # argparse wraps to the terminal's width
    try:
        return parser.format_help()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def setup(app: Any) -> dict[str, Any]:
    from docutils import nodes
    from sphinx.util.docutils import SphinxDirective

    def inline(text: str) -> list[nodes.Node]:
        """Text with `code` spans (the settings' docs quote code in backticks)."""
        parts = text.replace("``", "`").split("`")
        return [
            nodes.literal(part, part) if index % 2 else nodes.Text(part)
            for index, part in enumerate(parts)
            if part
        ]

    def row(cells: list[list[nodes.Node]]) -> nodes.row:
        table_row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *cell)
            table_row += entry
        return table_row

    class SettingsDirective(SphinxDirective):
        def run(self) -> list[nodes.Node]:
            group = nodes.tgroup(cols=4)
            for width in (25, 20, 12, 43):
                group += nodes.colspec(colwidth=width)
            head = nodes.thead()
            head += row(
                [[nodes.Text(title)] for title in ("Setting", "Type", "Default", "Meaning")]
            )
            body = nodes.tbody()
            for name, expected, default, doc in settings_rows():
                target = nodes.target("", "", ids=[nodes.make_id(name)])
                body += row(
                    [
                        [target, nodes.literal(name, name)],
                        inline(expected),
                        [nodes.literal(default, default)],
                        inline(doc),
                    ]
                )
            group += head
            group += body
            table = nodes.table("", group, classes=["outbox-settings"])
            return [table]

    class CommandDirective(SphinxDirective):
        required_arguments = 1

        def run(self) -> list[nodes.Node]:
            text = command_help(self.arguments[0])
            block = nodes.literal_block(text, text)
            block["language"] = "text"
            return [block]

    app.add_directive("outbox-settings", SettingsDirective)
    app.add_directive("outbox-command", CommandDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
