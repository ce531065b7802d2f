"""An ExaTrkX-style GNN particle-tracking pipeline in pure PyTorch, the reference workload.

Synthetic collision events (``events``), a learned embedding, a radius graph, an edge filter, an
interaction-network GNN and connected components (``pipeline``), each stage a plain function of
tensors traced by ``otelkit.stage``. ``python -m gnn_tracking.train`` produces the committed
weights in ``weights/``; ``python -m gnn_tracking.quality`` reports how well they track.

>>> from gnn_tracking.events import generate_event
>>> from gnn_tracking.models import load_models
>>> from gnn_tracking.pipeline import run_pipeline
>>> result = run_pipeline(load_models(), generate_event(40, seed=1).features)
"""
