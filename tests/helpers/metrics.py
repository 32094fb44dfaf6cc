"""Prometheus text (a /metrics page or a node_exporter text file) read as Prometheus reads it."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def sample_key(name: str, /, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The key of one sample in :data:`Samples`: its name and its labels, sorted."""
    return name, tuple(sorted(labels.items()))


def samples(text: str) -> Samples:
    """Every sample of the text, by :func:`sample_key`."""
    return {sample_key(s.name, **s.labels): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str) -> Samples:
    """What a scrape of ``url`` reads now."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return samples(response.read().decode())


def totals(scraped: Samples) -> dict[str, float]:
    """Each sample name's values summed over its labels."""
    summed: dict[str, float] = {}
    for (name, _), value in scraped.items():
        summed[name] = summed.get(name, 0.0) + value
    return summed


def metric_names(text: str) -> set[str]:
    """The sample names the text carries."""
    return {name for name, _ in samples(text)}
