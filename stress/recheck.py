"""`python -m stress.recheck TMP NAME`: check a finished run again, with this checker, on
the journal still in its database (the same STRESS_DB and STRESS_DB_NAME; the next run
resets it), and publish it as <NAME> in place of the first check (a relay run's queue
too, from consumed.jsonl). TMP is the run's
temporary directory (its faults.json holds the runner's records and the first result).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    tmp, name = Path(argv[0]), argv[1]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stress.settings")
    import django

    django.setup()
    from stress import broker, checker, consumer, report

    saved = json.loads((tmp / "faults.json").read_text())
    first = saved["result"]
    result = {**first, **checker.check(saved["info"])}
    received = broker.load(tmp)  # the relay leg's queue, as read at the end
    if received is not None:
        result.update(consumer.check(saved["info"], received, tmp))
    result["rechecked"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["first_check_unexplained"] = first["unexplained_duplicates"]
    (tmp / "recheck.json").write_text(json.dumps({"info": saved["info"], "result": result}))
    print(report.publish(name, os.environ.get("STRESS_DB", "postgres"), result))
    found = report.problems(result)
    for problem in found:
        print(f"FAIL: {problem}", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
