"""Internal: what takes telemetry out of the process (OTLP encoders and exporters, the batch
processor, the Prometheus endpoint), set up by ``otelkit.configure``. Nothing here is public.
"""

__all__: list[str] = []
