"""The client side: the five service options, the threaded instrumented client, ``make demo``.

``python -m gnn_tracking.driving.client --option 4 --url 127.0.0.1:8001`` drives a server;
``python -m gnn_tracking.driving.demo`` runs the whole reference deployment end to end.
"""
