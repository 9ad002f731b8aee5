"""The Prometheus alert rules and the Grafana dashboard shipped in deploy/: valid, and
naming only metrics the code exports, so renaming a metric breaks this test, not an
operator's alerting. `promtool` (Debian's prometheus package; `scripts/setup_promtool.sh`)
checks the rules and runs their unit tests where it is installed."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from outbox.metrics.base import ScopeHealth
from outbox.metrics.prometheus import PrometheusMetrics

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "outbox-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "outbox-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "outbox-dashboard.json"
# An outbox metric in a PromQL expression (a label value such as "outbox.RegionOutbox"
# has a dot, so it is not taken for one).
METRIC = re.compile(r"\boutbox_[a-z_]+\b(?![.])")
# The alerts the operating how-to promises.
ALERTS = {
    "OutboxDeadLetters",
    "OutboxOldestDueMessageTooOld",
    "OutboxShardsFailing",
    "OutboxExpiredLeases",
    "OutboxReceiverStuck",
    "OutboxBacklogGrowing",
    "OutboxGaugesNotRefreshed",
    "OutboxGaugesAbsent",
    "OutboxGaugesGone",
    "OutboxMessagesDeadLettered",
    "OutboxVacuumHeldBack",
    "OutboxDeadTuplesGrowing",
}


def exported_names():
    """Every sample name the Prometheus adapter exports, each method called once."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    table, scope, category = "outbox.RegionOutbox", "ORGANIZATION", "AUDIT_EVENT"
    metrics.saved(table, scope, category, 1)
    metrics.processed(table, scope, category, 1, 0.1, 0.1)
    metrics.failed(table, scope, category)
    metrics.dead_lettered(table, scope, category)
    metrics.lease_lost(table, scope)
    metrics.backlog(table, scope, 1, 1)
    metrics.health(table, scope, ScopeHealth())
    metrics.gauges_read(table, 0.0)
    metrics.receiver_finished(table, scope, category, "app.receiver", 0.1)
    metrics.claimed(table, 1, 0.1)
    metrics.stuck_receivers(table, 0)
    metrics.xmin_horizon("default", 1.0, 1)
    metrics.dead_tuples(table, "default", 1)
    return {sample.name for family in registry.collect() for sample in family.samples}


def rules():
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard_expressions(dashboard):
    """The PromQL of every panel target and query variable."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["definition"]


def test_the_exported_names_are_what_the_rules_can_name():
    names = exported_names()
    assert "outbox_oldest_due_age_seconds" in names
    assert "outbox_processing_lag_seconds_bucket" in names
    assert "outbox_saved_total" in names


def test_the_alert_rules_are_the_promised_ones_on_exported_metrics():
    names = exported_names()
    found = rules()
    assert {rule["alert"] for rule in found} == ALERTS
    for rule in found:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        used = set(METRIC.findall(rule["expr"]))
        assert used, rule["alert"]
        assert used <= names, (rule["alert"], used - names)


def test_the_dashboard_queries_only_exported_metrics():
    names = exported_names()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used = set()
    for expr in dashboard_expressions(dashboard):
        used |= set(METRIC.findall(expr))
    assert used and used <= names, used - names
    for name in (
        "outbox_oldest_due_age_seconds",
        "outbox_dead_letters",
        "outbox_failing_shards",
        "outbox_expired_leases",
        "outbox_stuck_receivers",
    ):
        assert name in used


def promtool():
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("OUTBOX_REQUIRE_PROMTOOL"):
            pytest.fail("promtool is missing: bash scripts/setup_promtool.sh installs it")
        pytest.skip("promtool is not installed (bash scripts/setup_promtool.sh)")
    return path


def test_promtool_checks_the_rules():
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_runs_the_rules_unit_tests():
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
