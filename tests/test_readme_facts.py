"""The README's "Supported versions" tables tell the truth: the Python and Django versions
are exactly those of pyproject.toml's classifiers, every Python/Django pair is a leg of
tox.ini's matrix, Django 6 is only claimed on Python 3.12+, every database of the matrix
has a row with a minimum, and no sentence elsewhere in the README names another version.

Each check returns a list of problems, so the last tests can show that each one fails on a
README that says something else."""

import configparser
import itertools
import re
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYPROJECT = (ROOT / "pyproject.toml").read_text()
TOX_INI = (ROOT / "tox.ini").read_text()

SECTION = "Supported versions"
VERSION = re.compile(r"\b\d+\.\d+\b")
# tox's database factors and the names the README gives them.
DATABASES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mariadb": "MariaDB"}


def tables_under(heading, text):
    """The Markdown tables of the `## heading` section, each a list of {column: cell}."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no '## {heading}' section"
    tables, rows = [], []
    for line in [*match.group(1).splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            header, _separator, *body = rows
            tables.append([dict(zip(header, row, strict=True)) for row in body])
            rows = []
    return tables


def table_with(column, text):
    """The first table of the section that has this column."""
    for table in tables_under(SECTION, text):
        if table and column in table[0]:
            return table
    raise AssertionError(f"no table with a {column!r} column under '## {SECTION}'")


def supported_pairs(text):
    """{(python, django)} from the versions table: "5.2 LTS" is Django 5.2."""
    pairs = set()
    for row in table_with("Django", text):
        djangos = VERSION.findall(row["Django"])
        pythons = VERSION.findall(row["Python"])
        assert len(djangos) == 1 and pythons, f"a row without versions: {row}"
        pairs |= {(python, djangos[0]) for python in pythons}
    return pairs


def classifier_versions(framework, pyproject):
    """The versions of the "Programming Language :: Python :: 3.x" or "Framework ::
    Django :: x.y" classifiers."""
    return set(re.findall(rf'"{re.escape(framework)} :: (\d+\.\d+)"', pyproject))


def requires_python(pyproject):
    return SpecifierSet(re.search(r'^requires-python\s*=\s*"([^"]+)"', pyproject, re.M)[1])


def expand(pattern):
    """tox's brace factors: "py{310,311}-django52" -> {"py310-django52", "py311-django52"}."""
    parts = re.split(r"(\{[^}]*\})", pattern)
    choices = [part[1:-1].split(",") if part.startswith("{") else [part] for part in parts]
    return {"".join(choice) for choice in itertools.product(*choices)}


def tox_matrix(tox_ini):
    """[(python, Django specifier, database)] for every env of the envlist, the Django
    range taken from the deps line of the env's django factor."""
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(tox_ini)
    specifiers = {}
    for line in config["testenv"]["deps"].splitlines():
        dep = re.fullmatch(r"(\w+):\s*django\s*([<>=!~][^\s#]*)", line.strip(), re.I)
        if dep:
            specifiers[dep[1]] = SpecifierSet(dep[2])
    matrix = []
    for line in config["tox"]["envlist"].split():
        for pattern in re.split(r",(?![^{]*\})", line):
            for env in expand(pattern):
                python = factor(env, lambda f: re.fullmatch(r"py3\d+", f))
                django = factor(env, specifiers.__contains__)
                database = factor(env, DATABASES.__contains__)
                matrix.append((f"3.{python[3:]}", specifiers[django], database))
    return matrix


def factor(env, wanted):
    found = [f for f in env.split("-") if wanted(f)]
    assert len(found) == 1, f"tox env {env}: expected one such factor, found {found}"
    return found[0]


def classifier_problems(text, pyproject):
    problems = []
    pairs = supported_pairs(text)
    for framework, index in (("Programming Language :: Python", 0), ("Framework :: Django", 1)):
        table = {pair[index] for pair in pairs}
        classified = classifier_versions(framework, pyproject)
        assert classified, f"pyproject.toml has no {framework} :: x.y classifier"
        problems += [f"{framework} :: {v} is not in the table" for v in classified - table]
        problems += [f"the table's {v} has no {framework} classifier" for v in table - classified]
    allowed = requires_python(pyproject)
    problems += [
        f"Python {python} is outside requires-python {allowed}"
        for python, _ in pairs
        if Version(python) not in allowed
    ]
    return sorted(problems)


def matrix_problems(text, tox_ini):
    matrix = tox_matrix(tox_ini)
    assert matrix, "tox.ini's envlist is empty"
    problems = [
        f"Python {python} with Django {django} is not in tox.ini's envlist"
        for python, django in supported_pairs(text)
        if not any(py == python and Version(django) in spec for py, spec, _ in matrix)
    ]
    rows = {row["Database"]: row for row in table_with("Database", text)}
    for database in sorted({database for *_, database in matrix}):
        row = rows.get(DATABASES[database])
        if row is None:
            problems.append(f"tox tests {database}, the table has no {DATABASES[database]} row")
        elif not re.search(r"\d", row["Minimum"]):
            problems.append(f"the {DATABASES[database]} row names no minimum version")
    return problems


def django_6_problems(text):
    return [
        f"Django {django} is claimed on Python {python}: Django 6 needs Python 3.12+"
        for python, django in sorted(supported_pairs(text))
        if Version(django) >= Version("6") and Version(python) < Version("3.12")
    ]


def prose_problems(text):
    """Sentences such as "Django 6.x" or "Python 3.9" anywhere in the README must name
    versions of the table."""
    pairs = supported_pairs(text)
    known = {"Python": {p for p, _ in pairs}, "Django": {d for _, d in pairs}}
    return [
        f"the README says {name} {version}, which the table does not list"
        for name, versions in known.items()
        for version in re.findall(rf"\b{name} (\d+\.(?:\d+|x))\b", text)
        if version not in versions
    ]


def test_the_table_is_read():
    pairs = supported_pairs(README)
    assert ("3.11", "5.2") in pairs
    assert {row["Database"] for row in table_with("Database", README)} >= set(DATABASES.values())
    assert len(tox_matrix(TOX_INI)) >= len(pairs)


def test_python_and_django_versions_match_the_classifiers():
    assert classifier_problems(README, PYPROJECT) == []


def test_every_pair_and_database_is_in_the_tox_matrix():
    assert matrix_problems(README, TOX_INI) == []


def test_django_6_only_on_python_312_and_later():
    assert django_6_problems(README) == []


def test_the_prose_names_only_versions_of_the_table():
    assert prose_problems(README) == []


def replaced(text, old, new):
    assert text.count(old) == 1, f"the README no longer contains {old!r} once"
    return text.replace(old, new)


ROW_52 = "| 5.2 LTS | 3.10, 3.11, 3.12, 3.13 |"
ROW_6 = "| 6.0 | 3.12, 3.13 |"


@pytest.mark.parametrize(
    ("old", "new", "check", "expected"),
    [
        # A classifier version missing from the table, and one the table adds.
        (ROW_52, "| 5.2 LTS | 3.11, 3.12, 3.13 |", "classifiers", "Python :: 3.10 is not"),
        (ROW_6, "| 6.0 | 3.12, 3.13, 3.14 |", "classifiers", "3.14 has no"),
        (ROW_6, "| 6.1 | 3.12, 3.13 |", "classifiers", "6.1 has no"),
        (ROW_52, "| 5.2 LTS | 3.9, 3.10, 3.11, 3.12, 3.13 |", "classifiers", "requires-python"),
        # A pair tox does not run, a database it tests without a row.
        (ROW_6, "| 6.0 | 3.11, 3.12, 3.13 |", "matrix", "3.11 with Django 6.0"),
        ("| MariaDB |", "| MySQL 5 |", "matrix", "no MariaDB row"),
        # Django 6 on an older Python.
        (ROW_6, "| 6.0 | 3.11, 3.12, 3.13 |", "django 6", "Python 3.11"),
        # A sentence contradicting the table.
        ("Django 6 needs Python", "Django 6.x needs Python", "prose", "Django 6.x"),
    ],
)
def test_each_check_fails_on_a_readme_that_says_otherwise(old, new, check, expected):
    text = replaced(README, old, new)
    problems = {
        "classifiers": lambda: classifier_problems(text, PYPROJECT),
        "matrix": lambda: matrix_problems(text, TOX_INI),
        "django 6": lambda: django_6_problems(text),
        "prose": lambda: prose_problems(text),
    }[check]()
    assert any(expected in problem for problem in problems), problems
