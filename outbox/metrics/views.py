"""Prometheus' ``/metrics`` served by the Django project itself, with the outbox gauges
read as it is scraped, whether or not a drain runs::

    # urls.py
    from outbox.metrics.views import prometheus_metrics

    urlpatterns = [..., path("metrics", prometheus_metrics)]

Each scrape first reads the backlog, health and vacuum gauges (`record_backlog`: the
expired leases of a drain that died among them), unless a process of the same
multiprocess directory read them within OUTBOX_METRICS_REFRESH_SECONDS (with it 0, every
scrape reads); then it answers with the installed adapter's registry or, with
``PROMETHEUS_MULTIPROC_DIR`` set, with every process of that directory
(`outbox.metrics.prometheus.multiprocess_registry`, which also withdraws the gauges of
processes that ended without doing it themselves). It answers 503 while OUTBOX_METRICS
is not a Prometheus adapter.

It asks for no login, as Prometheus sends none: route it where only Prometheus reaches
it (an internal port, a path the public proxy does not pass).
"""

from __future__ import annotations

import os

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from outbox.conf import outbox_settings
from outbox.metrics.feed import installed
from outbox.metrics.refresh import RefreshTimer

__all__ = ["prometheus_metrics"]


@require_safe
@transaction.non_atomic_requests
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """The outbox gauges read (at most once per OUTBOX_METRICS_REFRESH_SECONDS across a
    multiprocess directory), then every Prometheus metric of this process or directory."""
    try:
        from prometheus_client.exposition import choose_encoder

        from outbox.metrics.prometheus import PrometheusMetrics, multiprocess_registry
    except ImportError:
        return _unavailable("prometheus_client is not installed")
    metrics = installed()
    if not isinstance(metrics, PrometheusMetrics):
        return _unavailable(
            f'OUTBOX_METRICS is {outbox_settings.METRICS!r}, not "prometheus" (or a '
            "PrometheusMetrics subclass)"
        )
    RefreshTimer(outbox_settings.METRICS_REFRESH_SECONDS).refresh()
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    registry = multiprocess_registry(directory) if directory else metrics.registry
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)


def _unavailable(why: str) -> HttpResponse:
    return HttpResponse(
        f"outbox metrics are not served: {why}.\n", status=503, content_type="text/plain"
    )
