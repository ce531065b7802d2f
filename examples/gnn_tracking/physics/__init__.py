"""The tracking workload itself, with no server: events, graph, networks, stages, training.

``python -m gnn_tracking.physics.train`` writes ``gnn_tracking/weights``;
``python -m gnn_tracking.physics.quality`` reports how well they track.
"""
