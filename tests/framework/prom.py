"""Reading a Prometheus scrape in tests: every sample by (name, sorted labels)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of a scrape (the text format) by (name, sorted labels)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scraped: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the scrape has none with these labels."""
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)
