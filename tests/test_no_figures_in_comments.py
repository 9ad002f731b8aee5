"""Comments and docstrings under `outbox/` say what the code does and why; benchmark
figures and their history belong in bench/, the docs and the changelog, where they are
measured and dated. A rate, a speed-up or a timing quoted in the code goes stale unseen."""

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "outbox"

FIGURES = re.compile(
    r"""\b\d[\d,.]*\s*k?\s*(messages|rows|msgs|calls|statements|requests|flushes)
            \s+(a|per)\s+second\b                          # 30k messages a second
      | \b\d[\d.,]*\s*[kKM]?\s*(rows|msgs?|messages)?/s\b  # 45k/s, 900 rows/s
      | \b\d[\d.]*k\b(?!\s*(shards|rows|keys|messages))  # 2.8k against 27-30k
      | \b\d[\d.]*(\s*-\s*\d[\d.]*)?\s*times\s+(slower|faster|dearer|cheaper)\b
      | \b\d[\d.]*\s*(%|percent)\s+(slower|faster|more|less|of\s+the)\b
      | \b\d[\d.]*(\s*-\s*\d[\d.]*)?\s*(ms|µs|us)\b(?!\s*(timeout|interval|poll))
    """,
    re.VERBOSE,
)


def _prose(path):
    """(line, text) of every comment and docstring of one module."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                yield node.body[0].lineno, doc


def test_no_comment_or_docstring_quotes_a_benchmark_figure():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {match.group(0)!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts
        for line, text in _prose(path)
        for match in FIGURES.finditer(" ".join(text.split()))
    ]
    assert not found, (
        "benchmark figures in the code's prose (move them to bench/ or docs/):\n" + "\n".join(found)
    )


def test_the_pattern_finds_the_figures_it_is_for():
    quoted = [
        "from about 30k to 55k messages a second on the benchmark's machine",
        "it drains 45k/s",
        "one message per shard: 2.8k messages a second against 27-30k",
        "it settled 100 times slower and read 1.4-1.7 times slower",
        "this statement saves 0.4-0.6 ms of that a flush",
        "900 rows/s",
    ]
    assert all(FIGURES.search(text) for text in quoted)
    plain = ["a second stop request", "at most 10,000 rows", "OUTBOX_BATCH_ROWS (2000)"]
    assert not any(FIGURES.search(text) for text in plain)
