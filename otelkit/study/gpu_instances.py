"""GPU memory and utilisation per Triton model instance, from otelkit's GPU metrics.

otelkit's GPU exporter (``otelkit gpu-exporter`` beside Triton, or a server configured with GPU
metrics) names the owner of each process on a GPU: ``triton:<model instance>`` for a
Python-backend stub (``embed_0_1``: instance 1 of group 0 of model ``embed``). A study given
that page (``Study(gpu_metrics_url=...)``, ``--gpu-metrics-url``) reads it when each point's
window closes and records, per instance, its device memory, its share of the GPU's memory (the
seeds' "about 18 % of an A100 per instance") and the utilisation of the GPU it runs on (NVML
gives utilisation per device, not per process: instances on one GPU share its figure).

>>> from otelkit import semconv
>>> memory = semconv.prometheus_name(semconv.GPU_PROCESS_MEMORY)
>>> page = f'''# TYPE {memory} gauge
... {memory}{{gpu_uuid="GPU-1",pid="7",process_name="stub",owner="triton:gnn_0_1"}} 4e9
... '''
>>> parse_instances(page)["gnn_0_1"]["memory_bytes"]
4000000000.0
>>> model_of("build_graph_0_1")
'build_graph'
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from otelkit import semconv

__all__ = ["model_of", "parse_instances", "per_model", "scrape_instances"]

_OWNER_PREFIX = "triton:"
_MEMORY = semconv.prometheus_name(semconv.GPU_PROCESS_MEMORY)
_GPU = {
    semconv.prometheus_name(semconv.GPU_UTILIZATION): "gpu_utilization",
    semconv.prometheus_name(semconv.GPU_MEMORY_TOTAL): "gpu_memory_total_bytes",
}


def model_of(instance: str) -> str:
    """The model of a Triton instance name, ``<model>_<group>_<index>``."""
    parts = instance.rsplit("_", 2)
    return parts[0] if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() else instance


def parse_instances(text: str) -> dict[str, dict[str, Any]]:
    """Per model instance on a GPU: ``memory_bytes``, ``gpu_uuid``, and, when the page has its
    GPU's gauges, ``gpu_utilization`` (0 to 1), ``gpu_memory_total_bytes`` and
    ``memory_share`` (of the GPU's memory)."""
    instances: dict[str, dict[str, Any]] = {}
    gpus: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            uuid = sample.labels.get(semconv.M_GPU_UUID, "")
            if sample.name == _MEMORY:
                owner = sample.labels.get(semconv.M_OWNER, "")
                if owner.startswith(_OWNER_PREFIX) and len(owner) > len(_OWNER_PREFIX):
                    entry = instances.setdefault(owner[len(_OWNER_PREFIX) :], {"memory_bytes": 0.0})
                    entry["memory_bytes"] += float(sample.value)  # a stub on one GPU: one pid
                    entry["gpu_uuid"] = uuid
            elif sample.name in _GPU:
                gpus.setdefault(uuid, {})[_GPU[sample.name]] = float(sample.value)
    for entry in instances.values():
        gpu = gpus.get(entry["gpu_uuid"], {})
        entry.update(gpu)
        total = gpu.get("gpu_memory_total_bytes")
        if total:
            entry["memory_share"] = entry["memory_bytes"] / total
    return instances


def scrape_instances(url: str, timeout_s: float = 5.0) -> dict[str, dict[str, Any]]:
    """``parse_instances`` of the page at ``url`` (an exporter's ``/metrics``)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_instances(response.read().decode("utf-8", "replace"))


def per_model(instances: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per model: its instances on GPUs, their mean memory and mean share of a GPU's memory.

    >>> per_model({"gnn_0_0": {"memory_bytes": 2e9, "memory_share": 0.25},
    ...            "gnn_0_1": {"memory_bytes": 4e9, "memory_share": 0.75}})
    {'gnn': {'instances': 2.0, 'memory_bytes': 3000000000.0, 'memory_share': 0.5}}
    """
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for name, entry in instances.items():
        grouped.setdefault(model_of(name), []).append(entry)
    figures = {}
    for model, entries in sorted(grouped.items()):
        shares = [float(e["memory_share"]) for e in entries if "memory_share" in e]
        figures[model] = {
            "instances": float(len(entries)),
            "memory_bytes": sum(float(e["memory_bytes"]) for e in entries) / len(entries),
            **({"memory_share": sum(shares) / len(shares)} if shares else {}),
        }
    return figures
