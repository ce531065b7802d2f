"""The ExaTrkX-style tracking example: event generator, graph algorithms against brute force,
the committed weights' quality, determinism, training end to end, and one span per stage."""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from gnn_tracking.physics.events import (
    HALF_LENGTH_MM,
    LAYER_RADII_MM,
    Event,
    generate_event,
    true_edges,
)
from gnn_tracking.physics.graph import connected_components, radius_graph
from gnn_tracking.physics.models import CONFIG_FILE, WEIGHTS_FILE, Models, load_models
from gnn_tracking.physics.pipeline import (
    build_graph,
    embed,
    filter_edges,
    gnn_scores,
    label_tracks,
    run_pipeline,
)
from gnn_tracking.physics.quality import edge_metrics, evaluate, track_efficiency
from gnn_tracking.physics.train import TrainSettings, train

import otelkit
from otelkit import semconv
from otelkit.analysis import build_traces, load_spans
from tests.paths import EXAMPLES

MIN_CURVATURE_RADIUS_MM = 0.5 / (0.3 * 2.0) * 1000  # pT >= 0.5 GeV in 2 T


@pytest.fixture(scope="module")
def models() -> Models:
    return load_models()


# -- events ------------------------------------------------------------------------------------


def test_an_event_has_the_documented_shapes_and_types() -> None:
    event = generate_event(40, seed=1)
    n = event.num_hits
    assert (event.features.shape, event.features.dtype) == ((n, 3), torch.float32)
    assert (event.particle_id.shape, event.particle_id.dtype) == ((n,), torch.int64)
    assert (event.layer.shape, event.layer.dtype) == ((n,), torch.int64)
    r, phi, z = event.features.T
    radii = torch.tensor(LAYER_RADII_MM) / 1000
    assert torch.allclose(r, radii[event.layer])
    assert bool((phi.abs() <= 1).all()) and bool((z.abs() <= HALF_LENGTH_MM / 1000).all())
    assert set(event.particle_id.tolist()) == set(range(41))


@pytest.mark.parametrize(("n_particles", "low", "high"), [(30, 250, 400), (3000, 25_000, 40_000)])
def test_the_number_of_particles_sets_the_size(n_particles: int, low: int, high: int) -> None:
    assert low <= generate_event(n_particles, seed=2).num_hits <= high


def test_a_seed_gives_the_same_event_and_another_seed_another() -> None:
    a, b, c = generate_event(40, seed=3), generate_event(40, seed=3), generate_event(40, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(_tensors(a), _tensors(b), strict=True))
    assert a.num_hits != c.num_hits or not torch.equal(a.features, c.features)


def test_hits_are_shuffled() -> None:
    event = generate_event(40, seed=5)
    ids = event.particle_id[event.particle_id > 0]
    assert 0 < int((ids[1:] == ids[:-1]).sum()) < len(ids) // 4  # consecutive only by chance


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3])
def test_noise_makes_up_the_asked_fraction_of_hits_on_the_layers(fraction: float) -> None:
    event = generate_event(200, noise_fraction=fraction, seed=6)
    noise = event.particle_id == 0
    assert abs(float(noise.float().mean()) - fraction) < 0.005
    assert not bool(torch.isin(true_edges(event), torch.nonzero(noise)).any())


def test_a_particles_hits_lie_on_one_helix_from_the_beam_line() -> None:
    event = generate_event(40, noise_fraction=0.0, seed=7)
    edges = true_edges(event)
    r = event.features[:, 0]
    # the truth graph walks outwards, one layer at a time
    assert bool((event.layer[edges[1]] == event.layer[edges[0]] + 1).all())
    assert bool((r[edges[1]] > r[edges[0]]).all())
    x, y, z = _cartesian_mm(event)
    for particle in range(1, 41):
        hits = torch.nonzero(event.particle_id == particle).squeeze(1)
        hits = hits[torch.argsort(r[hits])]
        assert len(hits) >= 5
        # transverse: a circle through the origin, x^2 + y^2 = 2 (a x + b y)
        xs, ys = x[hits], y[hits]
        design = torch.stack([2 * xs, 2 * ys], 1)
        a, b = torch.linalg.lstsq(design, (xs**2 + ys**2)[:, None]).solution[:, 0]
        radius = math.hypot(a, b)
        assert float(((xs - a).hypot(ys - b) - radius).abs().max()) < 0.5, particle
        assert radius > 0.95 * MIN_CURVATURE_RADIUS_MM
        # longitudinal: z grows linearly with the transverse path from a vertex near z = 0
        path = 2 * radius * torch.asin(r[hits].double() * 1000 / (2 * radius))
        design = torch.stack([torch.ones_like(path), path], 1)
        z0, slope = torch.linalg.lstsq(design, z[hits][:, None]).solution[:, 0]
        assert float((z0 + slope * path - z[hits]).abs().max()) < 5.0, particle
        assert abs(float(z0)) < 250 and abs(float(slope)) < math.sinh(1.5) + 0.01


def test_an_empty_event_and_bad_arguments() -> None:
    empty = generate_event(0, seed=1)
    assert empty.features.shape == (0, 3) and true_edges(empty).shape == (2, 0)
    with pytest.raises(ValueError, match="n_particles"):
        generate_event(-1)
    with pytest.raises(ValueError, match="noise_fraction"):
        generate_event(10, noise_fraction=1.0)


def _tensors(event: Event) -> tuple[torch.Tensor, ...]:
    return event.features, event.particle_id, event.layer


def _cartesian_mm(event: Event) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    features = event.features.double()
    r, phi, z = features[:, 0] * 1000, features[:, 1] * math.pi, features[:, 2] * 1000
    return r * torch.cos(phi), r * torch.sin(phi), z


# -- radius graph ------------------------------------------------------------------------------


def brute_radius_graph(x: torch.Tensor, radius: float, k: int | None = None) -> torch.Tensor:
    n = x.shape[0]
    if n == 0:
        return torch.empty(2, 0, dtype=torch.int64)
    close = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist") < radius
    close &= ~torch.eye(n, dtype=torch.bool)
    if k is not None:  # each point's k nearest within the radius, lower index first among equals
        d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
        ranked = torch.sort(torch.where(close, d2, math.inf), dim=1, stable=True).indices
        keep = torch.zeros_like(close).scatter_(1, ranked[:, :k], True) & close
        close = keep | keep.T
    i, j = torch.nonzero(torch.tril(close, -1), as_tuple=True)
    return torch.stack([i, j])


@pytest.mark.parametrize("n", [0, 1, 2, 7, 300, 1100])
@pytest.mark.parametrize("dim", [1, 3, 8])
@pytest.mark.parametrize("max_neighbours", [None, 1, 5])
def test_radius_graph_equals_brute_force(n: int, dim: int, max_neighbours: int | None) -> None:
    generator = torch.Generator().manual_seed(n * 31 + dim)
    x = torch.rand(n, dim, generator=generator)
    for radius in (0.02, 0.15, 0.6, 3.0):
        expected = brute_radius_graph(x, radius, max_neighbours)
        found = radius_graph(x, radius, max_neighbours=max_neighbours)
        assert found.dtype == torch.int64
        assert torch.equal(found, expected), (radius, found.shape, expected.shape)


def test_radius_graph_of_30k_points_stays_small_in_memory() -> None:
    generator = torch.Generator().manual_seed(8)
    x = torch.rand(30_000, 8, generator=generator)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    edges = radius_graph(x, 0.25)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mib < 1024  # an N x N float matrix alone would be 3.4 GiB
    assert bool((edges[0] > edges[1]).all())
    keys = edges[0] * 30_000 + edges[1]
    assert bool((keys[1:] > keys[:-1]).all())  # canonical order, no duplicates
    sample = torch.randperm(30_000, generator=generator)[:200]
    near = torch.cdist(x[sample], x, compute_mode="donot_use_mm_for_euclid_dist") < 0.25
    for row, point in enumerate(sample.tolist()):
        expected = set(torch.nonzero(near[row]).squeeze(1).tolist()) - {point}
        found = set(edges[1, edges[0] == point].tolist()) | set(
            edges[0, edges[1] == point].tolist()
        )
        assert found == expected, point


# -- connected components ----------------------------------------------------------------------


def union_find_labels(n: int, edges: torch.Tensor) -> list[int]:
    parent = list(range(n))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in edges.T.tolist():
        parent[root(a)] = root(b)
    numbers: dict[int, int] = {}
    return [numbers.setdefault(root(a), len(numbers)) for a in range(n)]


@pytest.mark.parametrize(("n", "m"), [(0, 0), (1, 0), (1, 3), (10, 4), (500, 300), (2000, 2500)])
def test_connected_components_equal_union_find(n: int, m: int) -> None:
    generator = torch.Generator().manual_seed(n + m)
    edges = torch.randint(0, max(n, 1), (2, m), generator=generator)
    labels = connected_components(n, edges)
    assert labels.dtype == torch.int64
    assert labels.tolist() == union_find_labels(n, edges)


def test_connected_components_number_by_smallest_node_and_follow_long_chains() -> None:
    # components {0, 4}, {1}, {2, 5}, {3}: numbered by their smallest node
    assert connected_components(6, torch.tensor([[5, 4], [2, 0]])).tolist() == [0, 1, 2, 3, 0, 2]
    n = 20_000  # one path through every node in random order: worst case for propagation
    path = torch.randperm(n, generator=torch.Generator().manual_seed(9))
    labels = connected_components(n, torch.stack([path[1:], path[:-1]]))
    assert bool((labels == 0).all())


# -- quality metrics ---------------------------------------------------------------------------


def test_edge_metrics_count_truth_edges_and_same_particle_pairs() -> None:
    truth = torch.tensor([[0, 1, 3], [1, 2, 4]])  # particles {0, 1, 2} and {3, 4}; 5 is noise
    edges = torch.tensor([[1, 2, 3, 5], [0, 0, 2, 4]])  # true, same particle, false, noise
    assert edge_metrics(edges, truth, 6) == (1 / 3, 2 / 4)
    none = torch.empty(2, 0, dtype=torch.int64)
    assert all(math.isnan(v) for v in edge_metrics(none, none, 3))  # nothing to count


def test_track_efficiency_needs_a_double_majority() -> None:
    particle = torch.tensor([1] * 6 + [2] * 6 + [3] * 4 + [0])
    labels = torch.tensor([0] * 6 + [1] * 3 + [2] * 3 + [0] * 4 + [3])
    # 1: all in track 0, which is 6/10 its own -> found; 2: split 3/3 -> lost; 3: < 5 hits
    assert track_efficiency(labels, particle, min_hits=5) == 0.5
    merged = torch.tensor([0] * 12 + [1] * 5)  # two equal particles in one track: neither found
    assert track_efficiency(merged, particle, min_hits=5) == 0.0


# -- the pipeline with the committed weights ---------------------------------------------------


def test_the_committed_weights_track_well_on_fresh_events(models: Models) -> None:
    # measured at training: 99.4 %, 98.6 % (purity 88 % from 73 %), 97.7 % at 100 % purity, 98.8 %
    assert (EXAMPLES / "gnn_tracking" / "weights" / WEIGHTS_FILE).is_file()
    report = evaluate(models, n_events=10, n_particles=40, seed=424_242)
    graph, filtered, gnn = (report[name] for name in ("build_graph", "filter", "gnn"))
    assert graph["efficiency"] >= 0.98, report
    assert filtered["efficiency"] >= 0.97, report
    assert filtered["purity"] >= graph["purity"] + 0.1, report
    assert gnn["efficiency"] >= 0.95 and gnn["purity"] >= 0.99, report
    assert report["track_efficiency"] >= 0.93, report


def test_the_committed_weights_cope_with_busier_events(models: Models) -> None:
    report = evaluate(models, n_events=2, n_particles=300, seed=515_151)  # ~3300 hits
    assert report["gnn"]["purity"] >= 0.98, report
    assert report["track_efficiency"] >= 0.9, report


def test_the_pipeline_is_deterministic_and_typed(models: Models) -> None:
    features = generate_event(40, seed=10).features
    first, second = run_pipeline(models, features), run_pipeline(models, features.clone())
    for name in ("embedding", "edge_index", "filtered_edges", "scores", "labels"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    n = features.shape[0]
    assert (first.embedding.shape, first.embedding.dtype) == ((n, 8), torch.float32)
    assert first.edge_index.dtype == first.filtered_edges.dtype == torch.int64
    assert first.scores.shape == (first.filtered_edges.shape[1],)
    assert (first.labels.shape, first.labels.dtype) == ((n,), torch.int64)
    assert bool(torch.isin(_keys(first.filtered_edges, n), _keys(first.edge_index, n)).all())


@pytest.mark.parametrize("n_hits", [0, 1, 2])
def test_tiny_events_pass_through_every_stage(models: Models, n_hits: int) -> None:
    features = torch.tensor([[0.03, 0.5, 0.0], [0.9, -0.5, 1.5]])[:n_hits]
    result = run_pipeline(models, features)
    assert result.labels.tolist() == list(range(n_hits))  # too few or too far apart: no edges
    assert result.scores.shape == (0,) and result.filtered_edges.shape == (2, 0)


def test_a_30k_hit_event_completes_with_a_bounded_graph(models: Models) -> None:
    # The networks learnt on ~50-particle events: at 3000 the tracks merge (see the report of
    # ``python -m gnn_tracking.physics.quality --n-particles 3000``); only size and speed are
    # checked.
    event = generate_event(3000, seed=11)
    result = run_pipeline(models, event.features)
    assert result.labels.shape == (event.num_hits,)
    assert models.config.max_neighbours is not None
    assert result.edge_index.shape[1] <= event.num_hits * models.config.max_neighbours
    assert bool(((result.scores >= 0) & (result.scores <= 1)).all())


def _keys(edges: torch.Tensor, n: int) -> torch.Tensor:
    return torch.maximum(edges[0], edges[1]) * n + torch.minimum(edges[0], edges[1])


# -- training ----------------------------------------------------------------------------------


def test_training_runs_end_to_end_into_a_directory(tmp_path: Path) -> None:
    path = [str(EXAMPLES), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    command = [
        sys.executable,
        "-m",
        "gnn_tracking.physics.train",
        "--events",
        "4",
        "--n-particles",
        "10",
        "--steps",
        "0.02",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "track efficiency" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    models = load_models(weights_dir=tmp_path)
    assert run_pipeline(models, generate_event(10, seed=12).features).labels.dtype == torch.int64


def test_training_is_deterministic(tmp_path: Path) -> None:
    def tiny(out: Path) -> Models:
        settings = TrainSettings(events=2, n_particles=10, out=out, held_out=1, report_events=1)
        steps = dataclasses.replace(settings, embedding_steps=5, filter_steps=5, gnn_steps=5)
        return train(steps)

    first, second = tiny(tmp_path / "a"), tiny(tmp_path / "b")
    assert first.config == second.config
    for name, network in first.networks().items():
        other = second.networks()[name].state_dict()
        assert all(torch.equal(v, other[k]) for k, v in network.state_dict().items()), name


# -- telemetry ---------------------------------------------------------------------------------


@pytest.fixture
def traces(tmp_path: Path) -> Iterator[Path]:
    """otelkit writing spans to JSON-lines files under ``tmp_path``, as test_server_stages."""
    otelkit.configure(service_name="tracking", traces_dir=tmp_path, metrics_exporter="none")
    yield tmp_path
    otelkit.shutdown()


def test_every_stage_is_one_span_under_the_caller(models: Models, traces: Path) -> None:
    features = generate_event(40, seed=13).features
    with otelkit.stage("event"):
        run_pipeline(models, features)
    with torch.inference_mode():  # the stage functions on their own, too
        embedding = embed(models, features)
        edges = filter_edges(models, features, embedding, build_graph(models, embedding))
        label_tracks(models, features.shape[0], edges, gnn_scores(models, features, edges))
    otelkit.flush()
    spans = load_spans(traces)
    walks = sorted([(d, s.name) for d, s in t.walk()] for t in build_traces(spans).values())
    stages = ["embed", "build_graph", "filter", "gnn", "label"]
    assert walks == sorted(
        [[(0, "event"), *((1, name) for name in stages)], *([(0, name)] for name in stages)]
    )
    assert all(s.attributes[semconv.STAGE_NAME] == s.name for s in spans if s.name in stages)
