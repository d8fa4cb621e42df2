"""Prometheus' text format without the `_created` series.

prometheus_client exports, beside every counter and histogram, a `<name>_created` gauge holding the
Unix time the series was created. vLLM's /metrics has none, scrapers do not need it, and it doubles
the families a reader of /metrics scrolls through. `WithoutCreated` wraps a registry and drops those
samples from what it collects, so a scrape of it (generate_latest, or prometheus_client's own HTTP
server) has none, without the process-wide switch (`prometheus_client.disable_created_metrics`),
which would change every other registry in the process.
"""
from prometheus_client import generate_latest


class WithoutCreated:
    """A registry's metrics, less every `_created` sample; pass it wherever a registry is collected."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


def exposition(registry) -> bytes:
    """generate_latest(registry), less every `_created` series."""
    return generate_latest(WithoutCreated(registry))
