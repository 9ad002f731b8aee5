"""The reference pages match the code: the settings table, the management commands' usage
and options and the Python API page, committed in the Markdown as
`python -m docs._ext.outbox_reference` generates them, and the system check ids."""

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

from outbox.conf import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _reference_extension():
    path = DOCS / "_ext" / "outbox_reference.py"
    spec = importlib.util.spec_from_file_location("outbox_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _reference_extension()


def test_the_generated_settings_table_lists_every_setting_with_its_default():
    rows = reference.settings_rows()
    assert [name for name, *_ in rows] == [f"OUTBOX_{name}" for name in SETTINGS]
    for (name, expected, default, doc), setting in zip(rows, SETTINGS.values(), strict=True):
        assert default == repr(setting.default), name
        assert expected == setting.expected, name
        assert doc == setting.doc and doc.strip(), name


def test_the_settings_page_holds_the_generated_table():
    page = (DOCS / "reference" / "settings.md").read_text()
    assert page == reference.with_settings_table(page), (
        "docs/reference/settings.md is stale: run python -m docs._ext.outbox_reference"
    )
    for name, *_ in reference.settings_rows():
        assert f"| `{name}` |" in page, name


COMMANDS_PAGE = DOCS / "reference" / "commands.md"


def _documented_commands():
    return reference.documented_commands(COMMANDS_PAGE.read_text())


def test_every_management_command_is_documented():
    commands = sorted(path.stem for path in (ROOT / "outbox/management/commands").glob("[!_]*.py"))
    assert sorted(_documented_commands()) == commands


def test_the_commands_page_holds_the_generated_reference():
    page = COMMANDS_PAGE.read_text()
    assert page == reference.with_command_references(page), (
        "docs/reference/commands.md is stale: run python -m docs._ext.outbox_reference"
    )
    for name in _documented_commands():
        assert reference.command_reference(name) in page, name


def test_a_stale_commands_reference_is_told_apart():
    page = COMMANDS_PAGE.read_text()
    stale = page.replace("| `--database DATABASE` |", "| `--db DATABASE` |", 1)
    assert stale != page
    assert reference.with_command_references(stale) == page


def _options(parser):
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize("name", _documented_commands())
def test_the_commands_reference_is_generated_from_its_parser(name):
    text = reference.command_reference(name)
    assert text.startswith(f"```text\nusage: manage.py {name}")
    assert "--database" in text
    # Every option the command adds is in its table; Django's common ones are left out.
    parser = load_command_class("outbox", name).create_parser("manage.py", name)
    common = _options(BaseCommand().create_parser("manage.py", name))
    table = text.partition("| Argument | Meaning |")[2]
    assert set(re.findall(r"^\| `(-[\w-]+)", table, re.MULTILINE)) == _options(parser) - common
    assert "--verbosity" not in text and "--help" not in text


@pytest.mark.parametrize("columns", ["40", "200"])
def test_the_commands_reference_does_not_depend_on_the_terminal_width(monkeypatch, columns):
    expected = reference.command_reference("drain_outboxes")
    monkeypatch.setenv("COLUMNS", columns)
    assert reference.command_reference("drain_outboxes") == expected


def test_no_page_uses_an_outbox_directive():
    # The pages hold generated Markdown instead: a directive would render as an empty
    # block on GitHub.
    pages = [path for path in DOCS.rglob("*.md") if "_build" not in path.parts]
    assert pages
    assert [str(path.relative_to(DOCS)) for path in pages if "{outbox-" in path.read_text()] == []


def test_every_system_check_id_is_documented():
    in_code = set()
    for path in (ROOT / "outbox").rglob("*.py"):
        in_code |= set(re.findall(r"outbox\.[EW]\d{3}", path.read_text()))
    page = (DOCS / "reference" / "checks.md").read_text()
    assert in_code, "no check ids found in outbox/"
    assert sorted(check for check in in_code if check not in page) == []


@pytest.mark.parametrize("page", reference.EXIT_STATUS_PAGES, ids=lambda path: path.name)
def test_the_exit_status_table_is_the_code_s_wherever_it_is_shown(page):
    text = page.read_text()
    assert text == reference.with_exit_status_table(text), (
        f"{page.relative_to(ROOT)} is stale: run python -m docs._ext.outbox_reference"
    )


def test_every_exit_status_a_command_uses_has_a_meaning():
    from outbox.management import exit_codes

    used = {
        value
        for name, value in vars(exit_codes).items()
        if name.isupper() and isinstance(value, int)
    }
    assert used == set(exit_codes.MEANINGS) == set(range(7))


API_PAGE = DOCS / "reference" / "api.md"


def test_the_api_page_is_the_generated_one():
    assert API_PAGE.read_text() == reference.api_page(), (
        "docs/reference/api.md is stale: run python -m docs._ext.outbox_reference"
    )


def _api_headings():
    return set(re.findall(r"^###? `([\w.]+)`$", API_PAGE.read_text(), re.MULTILINE))


def test_the_api_page_lists_every_exported_name():
    import outbox

    headings = _api_headings()
    assert {f"outbox.{name}" for name in outbox.__all__} <= headings
    for section in reference.API_SECTIONS:
        module = importlib.import_module(section.module)
        exported = getattr(module, "__all__", reference.api_exports(section))
        assert {f"{section.module}.{name}" for name in exported} <= headings, section.module


# What the Sphinx page (api.rst, autodoc) documented: the generated page keeps it.
DOCUMENTED_BEFORE = {
    "outbox.retry": ["RetryPolicy", "Failure", "policy_for"],
    "outbox.relays": ["Relay", "batch_receiver", "Message", "CloudEvents", "Bare"],
    "outbox.relays.webhooks": ["WebhookRelay"],
    "outbox.relays.amqp": ["AmqpRelay"],
    "outbox.relays.redis_streams": ["RedisStreamRelay"],
    "outbox.relays.kafka": ["KafkaRelay"],
    "outbox.relays.celery_tasks": ["CeleryTaskRelay"],
    "outbox.models": [
        "OutboxBase",
        "RegionOutbox",
        "ControlOutbox",
        "OutboxQuerySet",
        "ShardLease",
        "InboxRecord",
        "ShardLeaseQuerySet",
    ],
    "outbox.inbox": ["prune_inbox", "inbox_databases"],
    "outbox.exceptions": [
        "OutboxError",
        "OutboxConfigurationError",
        "MetricsUnavailable",
        "InvalidOutboxMessage",
        "UnknownDatabase",
        "InvalidThreshold",
        "OutboxContextRequired",
        "DrainInTransaction",
        "FlushInOpenTransaction",
        "NoReceiver",
        "RetryLater",
        "PermanentFailure",
        "StuckReceivers",
    ],
    "outbox.signals": ["OutboxSignal"],
    "outbox.engine": ["DrainWorker"],
    "outbox.metrics": ["Metrics"],
    "outbox.health": ["Thresholds", "check", "problems", "statuses", "backlog"],
}
MEMBERS_BEFORE = [
    "Relay.connect",
    "Relay.disconnect",
    "Relay.publish",
    "Relay.check",
    "Relay.close",
    "Message.shard_key",
    "Message.time",
    "Message.relay_headers",
    "OutboxBase.save",
    "OutboxBase.retry_dead",
    "OutboxBase.discard",
    "OutboxQuerySet.pending",
    "OutboxQuerySet.dead",
    "OutboxQuerySet.retry_dead",
    "OutboxQuerySet.discard",
    "OutboxQuerySet.bulk_create",
    "ShardLeaseQuerySet.held",
    "ShardLeaseQuerySet.backing_off",
    "ShardLeaseQuerySet.expired",
    "ShardLeaseQuerySet.live",
    "DrainWorker.run",
    "DrainWorker.request_stop",
    "DrainWorker.stop_all",
    "DrainWorker.handling_signals",
    "Metrics.saved",
    "RetryPolicy.row_delays",
    "OutboxCategory.max_attempts",
]


def test_the_api_page_keeps_what_the_sphinx_page_documented():
    page = API_PAGE.read_text()
    before = {f"{module}.{name}" for module, names in DOCUMENTED_BEFORE.items() for name in names}
    assert before <= _api_headings()
    assert [member for member in MEMBERS_BEFORE if f"#### `{member}`\n" not in page] == []


def test_the_api_page_reads_the_same_on_every_python():
    page = API_PAGE.read_text()
    # No repr with an address (an object's default) nor from the enum or typing machinery.
    assert " at 0x" not in page and "typing." not in page and "<class " not in page
    assert "new_class_name" not in page and "*values" not in page
    assert "class OutboxCategory(value)\n" in page


def test_the_api_page_links_to_its_own_headings():
    page = API_PAGE.read_text()
    anchors = {reference._anchor(f"`{heading}`") for heading in _api_headings()}
    links = re.findall(r"\]\(#([^)]+)\)", page)
    assert links
    assert [link for link in links if link not in anchors] == []


def test_docstrings_become_markdown():
    doc = (
        "Use ``a < b`` or `name` with :class:`Role`, as\n"
        "- this line says (not a list item); see::\n"
        "\n"
        "    call(x)\n"
        "\n"
        "- a list item\n"
        "  continued\n"
        "- another; '<rows> rows'"
    )
    assert reference.markdown(doc) == (
        "Use `a < b` or `name` with `Role`, as\n"
        "\\- this line says (not a list item); see:\n"
        "\n"
        "```python\n"
        "call(x)\n"
        "```\n"
        "\n"
        "- a list item\n"
        "  continued\n"
        "- another; '\\<rows> rows'\n"
    )
