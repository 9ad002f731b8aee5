"""The how-to "Publish to a broker or a webhook" states each relay's signature: it must be
the code's, parameter for parameter and default for default, so a newcomer's copy works."""

import ast
import inspect
import re
from pathlib import Path

import pytest

from outbox.relays import AmqpRelay, CeleryTaskRelay, KafkaRelay, RedisStreamRelay, WebhookRelay

HOWTO = Path(__file__).resolve().parent.parent / "docs" / "howto" / "relays.md"
RELAYS = [WebhookRelay, AmqpRelay, RedisStreamRelay, KafkaRelay, CeleryTaskRelay]


def documented(name: str) -> str:
    """The `Name(...)` signature the how-to gives, joined onto one line."""
    text = " ".join(HOWTO.read_text().split())
    found = re.search(rf"`{name}\((name, \*, [^`]*)\)`", text)
    assert found, f"the how-to gives no signature for {name}"
    return found.group(1)


@pytest.mark.parametrize("relay", RELAYS, ids=lambda relay: relay.__name__)
def test_the_howto_gives_each_relays_signature_as_the_code_has_it(relay):
    tree = ast.parse(f"def f({documented(relay.__name__)}): pass")
    args = tree.body[0].args
    names = [arg.arg for arg in args.args] + [arg.arg for arg in args.kwonlyargs]
    defaults = {
        arg.arg: ast.literal_eval(default)
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
        if default is not None
    }
    parameters = inspect.signature(relay.__init__).parameters
    assert names == [name for name in parameters if name != "self"]
    for name, parameter in parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            assert defaults.get(name) == parameter.default, f"{relay.__name__}: {name}"
        elif name != "self":
            assert name not in defaults, f"{relay.__name__}: {name} has no default"
