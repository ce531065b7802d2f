"""Graph building blocks in plain torch: the radius graph and connected components.

Both run on any device and need no compiled extension. ``radius_graph`` sweeps along the
coordinate with the widest spread: after sorting along it, a block of points can only have
neighbours within ``radius`` of it there, so it is compared with that window alone, in chunks, and
memory stays bounded however many points there are. ``connected_components`` propagates minimum
labels along edges with pointer jumping, a few dozen vectorised rounds at most.

>>> points = torch.rand(1000, 8)
>>> edges = radius_graph(points, 0.3)
>>> labels = connected_components(1000, edges)
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["connected_components", "radius_graph"]

_BLOCK = 512  # query points per step
_CHUNK = 8192  # candidate points per step: at most 4 Mi distances in memory at once


def radius_graph(
    x: torch.Tensor, radius: float, *, max_neighbours: int | None = None
) -> torch.Tensor:
    """Pairs of points closer than ``radius``: ``[2, E]`` int64 with ``i > j``, sorted by ``i``
    then ``j``, no self loops. Exact: the same pairs as a brute-force ``cdist(x, x) < radius``.

    With ``max_neighbours`` every point keeps only its ``max_neighbours`` nearest neighbours
    within the radius (of equally near ones, the lower indices); a pair is an edge when either
    of its points keeps the other, as a k-nearest-neighbours query made symmetric does.

    >>> radius_graph(torch.tensor([[0.0], [0.5], [2.0]]), 1.0).tolist()
    [[1], [0]]
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [N, D], got shape {tuple(x.shape)}")
    if max_neighbours is not None and max_neighbours < 0:
        raise ValueError(f"max_neighbours must be >= 0, got {max_neighbours}")
    n = x.shape[0]
    if n < 2 or radius <= 0 or max_neighbours == 0:
        return torch.empty(2, 0, dtype=torch.int64, device=x.device)
    axis = int(torch.argmax(x.amax(0) - x.amin(0)))
    keys, order = torch.sort(x[:, axis], stable=True)
    points = x[order]
    if max_neighbours is None:
        p, q = _sweep_pairs(points, keys, radius)
    else:
        p, q = _sweep_nearest(points, keys, order, radius, max_neighbours)
    a, b = order[p], order[q]
    key = torch.maximum(a, b) * n + torch.minimum(a, b)
    key = torch.unique(key)  # sorted, and each pair once when both of its points kept it
    return torch.stack([key // n, key % n])


def _blocks(
    points: torch.Tensor, keys: torch.Tensor, radius: float, *, both_sides: bool
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per block of sorted points: its first position, and the sorted positions ``p, q`` and
    squared distances of its pairs within the radius; ``q < p`` unless ``both_sides``."""
    limit = radius * radius
    n = points.shape[0]
    norms = (points * points).sum(1)
    slack = _bound_slack(points)
    if n <= _BLOCK:
        low, high = [0], [n]
    else:  # the window along the sweep axis of each block
        firsts = torch.arange(0, n, _BLOCK, device=points.device)
        lasts = (firsts + _BLOCK).clamp(max=n) - 1
        low = torch.searchsorted(keys, keys[firsts] - radius, side="left").tolist()
        high = torch.searchsorted(keys, keys[lasts] + radius, side="right").tolist()
    for block, first in enumerate(range(0, n, _BLOCK)):
        last = min(first + _BLOCK, n)
        ps: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        end = high[block] if both_sides else last
        for start in range(low[block], end, _CHUNK):
            stop = min(start + _CHUNK, end)
            # a matrix-product bound first, loose by its rounding; the exact test after
            sums = norms[first:last, None] + norms[None, start:stop]
            bound = torch.addmm(
                sums, points[first:last], points[start:stop].T, beta=1.0 - slack, alpha=-2.0
            )
            p, q = torch.nonzero(bound < limit * (1.0 + slack), as_tuple=True)
            ps.append(p + first)
            qs.append(q + start)
        p, q = _joined(ps, points.device), _joined(qs, points.device)
        d2 = _pair_distances(points, p, q)
        keep = (d2 < limit) & ((q != p) if both_sides else (q < p))
        chosen = torch.nonzero(keep).squeeze(1)
        yield first, p[chosen], q[chosen], d2[chosen]


def _bound_slack(points: torch.Tensor) -> float:
    """Relative error allowance of ``|a|^2 + |b|^2 - 2 a.b``: a few ulps per coordinate, more
    when float32 matrix products may run at reduced precision (TF32, bfloat16)."""
    eps = torch.finfo(points.dtype).eps
    if points.dtype == torch.float32 and (
        torch.get_float32_matmul_precision() != "highest"
        or (points.is_cuda and torch.backends.cuda.matmul.allow_tf32)
    ):
        eps = torch.finfo(torch.bfloat16).eps
    return 4.0 * (points.shape[1] + 2) * eps


def _pair_distances(points: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Squared distances of the pairs; each row is reduced on its own, so a pair gets the same
    rounding however the work is split into blocks."""
    return (points.index_select(0, p) - points.index_select(0, q)).pow(2).sum(1)


def _sweep_pairs(
    points: torch.Tensor, keys: torch.Tensor, radius: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """All pairs (p, q), q < p in sorted positions, closer than the radius."""
    rows: list[torch.Tensor] = []
    cols: list[torch.Tensor] = []
    for _, p, q, _ in _blocks(points, keys, radius, both_sides=False):
        rows.append(p)
        cols.append(q)
    return _joined(rows, points.device), _joined(cols, points.device)


def _sweep_nearest(
    points: torch.Tensor, keys: torch.Tensor, order: torch.Tensor, radius: float, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each sorted point, its ``k`` nearest others within the radius (lower index first
    among equally near ones)."""
    rows: list[torch.Tensor] = []
    cols: list[torch.Tensor] = []
    for first, p, q, d2 in _blocks(points, keys, radius, both_sides=True):
        # by point, then distance, then index: stable sorts from the last key to the first
        by = torch.sort(order[q], stable=True).indices
        by = by[torch.sort(d2[by], stable=True).indices]
        by = by[torch.sort(p[by], stable=True).indices]
        p, q = p[by], q[by]
        counts = torch.bincount(p - first, minlength=_BLOCK)
        group_start = torch.cumsum(counts, 0) - counts
        rank = torch.arange(p.shape[0], device=p.device) - group_start[p - first]
        chosen = torch.nonzero(rank < k).squeeze(1)
        rows.append(p[chosen])
        cols.append(q[chosen])
    return _joined(rows, points.device), _joined(cols, points.device)


def _joined(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=device)


def connected_components(num_nodes: int, edge_index: torch.Tensor) -> torch.Tensor:
    """Component label of every node, ``[num_nodes]`` int64, numbered 0..K-1 in the order of
    each component's smallest node index; a node without edges is a component of its own.

    >>> connected_components(5, torch.tensor([[3, 4], [1, 3]])).tolist()
    [0, 1, 2, 1, 1]
    """
    device = edge_index.device
    if edge_index.numel() and int(edge_index.max()) >= num_nodes:
        raise ValueError(f"edge_index refers to node {int(edge_index.max())} of {num_nodes}")
    parent = torch.arange(num_nodes, device=device)
    u, v = edge_index[0], edge_index[1]
    while True:
        before = parent
        pu, pv = parent[u], parent[v]
        low = torch.minimum(pu, pv)
        # hook: both ends and the larger of their parents point to the smaller parent
        parent = parent.scatter_reduce(0, torch.maximum(pu, pv), low, "amin")
        parent = parent.scatter_reduce(0, u, low, "amin")
        parent = parent.scatter_reduce(0, v, low, "amin")
        parent = _jump(parent)
        if torch.equal(parent, before):
            break
    # every node now points at its component's smallest node: renumber those 0..K-1
    labels: torch.Tensor = torch.unique(parent, sorted=True, return_inverse=True)[1]
    return labels


def _jump(parent: torch.Tensor) -> torch.Tensor:
    """Pointer jumping until every node points at a root."""
    while True:
        grand = parent[parent]
        if torch.equal(grand, parent):
            return parent
        parent = grand
