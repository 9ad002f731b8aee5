"""The release facts hold together: `pyproject.toml`'s version is the changelog's newest
release, dated and linked; every install line of the docs names that version's wheel or
tag; 0.2.0 says how to upgrade from 0.1.0 (migrations 0002 and 0003, which exist); every
migration after the first is named in the changelog; the package's metadata has its
URLs; and no CI step or script uploads the package.

Each check returns a list of problems, so the last tests can show that each one fails on
text that says something else."""

import datetime
import re
from pathlib import Path

import pytest
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
README = (ROOT / "README.md").read_text()
MIGRATIONS = sorted(
    path.stem for path in (ROOT / "outbox" / "migrations").glob("[0-9][0-9][0-9][0-9]_*.py")
)
SKIPPED = {"_build", ".venv", ".tox", "node_modules", "results"}
# The Markdown pages a user reads (the changelog's history may name older versions).
PAGES = sorted(
    path
    for path in ROOT.rglob("*.md")
    if not SKIPPED & set(path.relative_to(ROOT).parts) and path.name != "CHANGELOG.md"
)

RELEASE = re.compile(r"^## \[([^\]]+)\](?: - (\S+))?[ \t]*$", re.M)
WHEEL = re.compile(r"django_outboxes-(\d[\w.]*)-py3-none-any\.whl")
TAG_PIN = re.compile(r"django-outboxes(?:\[[^\]]*\])? @ git\+\S+?@v(\d[\w.]*)")
UPLOAD = re.compile(r"twine\s+upload|gh\s+release\s+upload|upload\.pypi\.org")
URLS = {"Homepage", "Repository", "Documentation", "Changelog", "Issues"}


def project_version(pyproject):
    project = re.search(r"^\[project\]\n(.*?)(?=^\[)", pyproject, re.M | re.S)
    assert project, "pyproject.toml has no [project] table"
    match = re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
    assert match, "pyproject.toml's [project] has no static version"
    return match.group(1)


def releases(changelog):
    """[(name, date or None)] of the `## [name] - date` headings, newest first."""
    return [(match.group(1), match.group(2)) for match in RELEASE.finditer(changelog)]


def section(changelog, name):
    """The text of the `## [name]` section, up to the next `## ` heading."""
    match = re.search(rf"^## \[{re.escape(name)}\][^\n]*\n(.*?)(?=^## |\Z)", changelog, re.M | re.S)
    assert match, f"CHANGELOG.md has no '## [{name}]' section"
    return match.group(1)


def changelog_problems(changelog, version):
    """The newest release is the package's version, under an `[Unreleased]` heading; every
    release has an ISO date, the releases go newest first, and every heading has a link."""
    found = releases(changelog)
    names = [name for name, _date in found]
    if names[:1] != ["Unreleased"]:
        return [f"the first section is {names[:1]}, not [Unreleased]"]
    problems = []
    if names[1:2] != [version]:
        problems.append(f"the newest release is {names[1:2]}, pyproject says {version}")
    versions = []
    for name, date in found[1:]:
        try:
            versions.append(Version(name))
        except InvalidVersion:
            problems.append(f"'## [{name}]' is no version")
        try:
            datetime.date.fromisoformat(date or "")
        except ValueError:
            problems.append(f"'## [{name}]' has no YYYY-MM-DD date: {date!r}")
    if versions != sorted(versions, reverse=True):
        problems.append(f"the releases are not newest first: {names[1:]}")
    for name in names:
        if not re.search(rf"^\[{re.escape(name)}\]: https://\S+$", changelog, re.M):
            problems.append(f"no link reference for [{name}]")
    unreleased = re.search(r"^\[Unreleased\]: (\S+)$", changelog, re.M)
    if unreleased and f"v{version}...HEAD" not in unreleased.group(1):
        problems.append(f"[Unreleased] does not compare v{version}...HEAD: {unreleased[1]}")
    return problems


def upgrade_problems(changelog, version, previous, migrations):
    """The release's section opens with `### Upgrading from <previous>`, which names each
    of these migrations (and only migrations that exist)."""
    text = section(changelog, version)
    first = re.search(r"^### (.+)$", text, re.M)
    if not first or first.group(1) != f"Upgrading from {previous}":
        return [f"{version} does not open with '### Upgrading from {previous}'"]
    notes = re.search(r"^### Upgrading[^\n]*\n(.*?)(?=^### |\Z)", text, re.M | re.S).group(1)
    problems = [f"the upgrade notes do not name {name}" for name in migrations if name not in notes]
    problems += [
        f"the upgrade notes name {name}, which is no migration"
        for name in sorted(set(re.findall(r"\b\d{4}_\w+", notes)))
        if name not in MIGRATIONS
    ]
    return problems


def install_line_problems(pages, version):
    """Every wheel file name and `@vX.Y.Z` pin of the pages names this version."""
    problems = []
    for page, text in pages.items():
        for pattern in (WHEEL, TAG_PIN):
            problems += [
                f"{page} installs {match.group(0)}"
                for match in pattern.finditer(text)
                if match.group(1) != version
            ]
    return problems


def test_the_newest_release_is_the_package_version():
    assert changelog_problems(CHANGELOG, project_version(PYPROJECT)) == []


def test_0_2_0_says_how_to_upgrade_from_0_1_0():
    assert "0002_message_identity" in MIGRATIONS and "0003_inbox" in MIGRATIONS
    notes = upgrade_problems(CHANGELOG, "0.2.0", "0.1.0", ["0002_message_identity", "0003_inbox"])
    assert notes == []
    text = section(CHANGELOG, "0.2.0")
    # Each part an operator needs, under its own words.
    for part in ("**Migrations**", "**Order of deploy**", "**Settings**", "**What to act on**"):
        assert part in text, part


def test_every_migration_after_the_first_is_in_the_changelog():
    assert MIGRATIONS[0] == "0001_initial"
    missing = [name for name in MIGRATIONS[1:] if f"outbox.{name}" not in CHANGELOG]
    assert not missing, f"CHANGELOG.md never names these migrations: {missing}"


def test_the_install_lines_name_the_package_version():
    version = project_version(PYPROJECT)
    pages = {str(path.relative_to(ROOT)): path.read_text() for path in PAGES}
    assert install_line_problems(pages, version) == []
    # The README shows both ways to pin a release: a wheel built from it, and its tag.
    assert f"django_outboxes-{version}-py3-none-any.whl" in README
    assert TAG_PIN.search(README), "the README shows no install pinned to a tag"


def test_the_package_metadata_is_complete():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads(PYPROJECT)["project"]
    for field in ("description", "readme", "requires-python", "license", "license-files"):
        assert project.get(field), f"pyproject.toml's [project] lacks {field}"
    assert project["readme"] == "README.md"
    assert any(c.startswith("Development Status ::") for c in project["classifiers"])
    assert not [c for c in project["classifiers"] if c.startswith("License ::")], (
        "a License classifier beside the license expression (PEP 639) fails the build"
    )
    assert set(project["urls"]) >= URLS, URLS - set(project["urls"])
    assert project["urls"]["Changelog"].endswith("/CHANGELOG.md")
    assert project["urls"]["Issues"].endswith("/issues")
    assert project["optional-dependencies"]["postgres"], "the [postgres] extra the docs install"


def test_no_ci_step_or_script_uploads_the_package():
    scripts = [
        path
        for folder in (".ci", "scripts")
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    assert scripts
    uploads = [str(path.relative_to(ROOT)) for path in scripts if UPLOAD.search(path.read_text())]
    assert not uploads, f"these upload the package: {uploads}"


# The checks fail on text that says something else.


def test_the_changelog_check_fails_on_a_stale_or_undated_release():
    assert changelog_problems(CHANGELOG, "9.9.9")
    undated = CHANGELOG.replace("## [0.2.0] - 2026-11-28", "## [0.2.0]")
    assert any("no YYYY-MM-DD date" in p for p in changelog_problems(undated, "0.2.0"))
    unreleased_gone = CHANGELOG.replace("## [Unreleased]\n", "", 1)
    assert changelog_problems(unreleased_gone, "0.2.0")
    unlinked = CHANGELOG.replace("\n[0.2.0]: ", "\n[0.2.0]:")
    assert "no link reference for [0.2.0]" in changelog_problems(unlinked, "0.2.0")


def test_the_upgrade_check_fails_without_its_notes_or_a_migration():
    notes = ("0002_message_identity", "0003_inbox")
    assert upgrade_problems(CHANGELOG, "0.2.0", "0.1.0", [*notes, "0004_missing"]) == [
        "the upgrade notes do not name 0004_missing"
    ]
    renamed = CHANGELOG.replace("### Upgrading from 0.1.0", "### Upgrade")
    assert upgrade_problems(renamed, "0.2.0", "0.1.0", notes)


def test_the_install_line_check_fails_on_another_version():
    pages = {
        "README.md": 'pip install "dist/django_outboxes-0.1.0-py3-none-any.whl[postgres]"\n'
        'pip install "django-outboxes[postgres] @ git+https://example.org/x@v0.1.0"\n'
    }
    assert len(install_line_problems(pages, "0.2.0")) == 2
    assert install_line_problems(pages, "0.1.0") == []
