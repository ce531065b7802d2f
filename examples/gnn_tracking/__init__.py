"""An ExaTrkX-style GNN particle-tracking pipeline in pure PyTorch, the reference deployment.

Grouped by role; each group imports only the ones above it:

``physics``
    the workload, no server: synthetic events (``events``), graph building (``graph``), the
    three networks and their weights (``models``), the five stages as ``otelkit.stage``
    functions (``pipeline``), training (``train``) and tracking quality (``quality``).
``serving``
    the pipeline served: the stage table (``stages``), the Triton Python-backend model
    (``triton_model``) and the repository written from the table (``repository``), Triton's
    launcher (``serve``), and the FastAPI twin (``twin``) on a KServe v2 server (``kserve``,
    ``kserve_tensors``).
``driving``
    the client side: the five service options (``options``), the threaded client
    (``client``) and ``make demo`` (``demo``).

Beside them, files rather than code: ``weights/`` (written by ``python -m
gnn_tracking.physics.train``), ``model_repository/`` (by ``python -m
gnn_tracking.serving.repository``) and ``deploy/`` (compose and Slurm files for a GPU site).

>>> from gnn_tracking.physics.events import generate_event
>>> from gnn_tracking.physics.models import load_models
>>> from gnn_tracking.physics.pipeline import run_pipeline
>>> result = run_pipeline(load_models(), generate_event(40, seed=1).features)
"""
