"""The pipeline served: by Triton (Python-backend models, an ensemble) and by a FastAPI twin.

``python -m gnn_tracking.serving.serve`` starts Triton on ``gnn_tracking/model_repository``,
traced; ``python -m gnn_tracking.serving.twin --port 8010`` serves the same models over KServe
v2 HTTP; ``python -m gnn_tracking.serving.repository --check`` checks the repository against
the stage table.
"""
