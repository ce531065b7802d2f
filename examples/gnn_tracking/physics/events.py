"""Synthetic collision events: helical tracks in a 2 T solenoid crossing ten barrel layers.

Each charged particle starts at a vertex smeared along the beam, curls in the transverse plane on
a circle of radius ``R = pT / (0.3 B)`` through the beam line and advances in z in proportion to
its transverse path. It leaves one hit per layer it reaches, smeared by the layer's resolution; it
stops at the first layer it cannot reach (it loops back inside, or leaves the barrel's length).
Noise hits fall uniformly on the layers. Hits are shuffled, so their order reveals nothing.

Features are what ExaTrkX feeds its embedding: ``(r / 1000, phi / pi, z / 1000)``, mm and rad.

>>> event = generate_event(40, seed=1)
>>> event.features.shape, int((event.particle_id == 0).sum())
(torch.Size([444, 3]), 44)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "B_FIELD_T",
    "ETA_MAX",
    "HALF_LENGTH_MM",
    "LAYER_RADII_MM",
    "Event",
    "generate_event",
    "true_edges",
]

B_FIELD_T = 2.0
LAYER_RADII_MM = (30.0, 70.0, 115.0, 170.0, 260.0, 360.0, 500.0, 660.0, 820.0, 1000.0)
HALF_LENGTH_MM = 2200.0
ETA_MAX = 1.5
PT_RANGE_GEV = (0.5, 10.0)
VERTEX_SIGMA_Z_MM = 50.0
# pixels inside, strips outside: fine in r-phi everywhere, coarse in z on the strips
_PIXEL_LAYERS = 4
_SIGMA_RPHI_MM = (0.015, 0.08)
_SIGMA_Z_MM = (0.05, 1.0)


@dataclass(frozen=True)
class Event:
    """The hits of one event and their truth, one row per hit, in random order.

    ``features``: ``[N, 3]`` float32 ``(r / 1000, phi / pi, z / 1000)``; ``particle_id``: ``[N]``
    int64, 1.. for the particles, 0 for noise; ``layer``: ``[N]`` int64, 0 innermost.
    """

    features: torch.Tensor
    particle_id: torch.Tensor
    layer: torch.Tensor

    @property
    def num_hits(self) -> int:
        return int(self.features.shape[0])


def generate_event(
    n_particles: int = 40, *, noise_fraction: float = 0.1, seed: int | None = None
) -> Event:
    """An event of ``n_particles`` charged particles (about ten hits each) plus noise hits that
    make up ``noise_fraction`` of all hits. The same ``seed`` gives the same event.

    >>> generate_event(3000, seed=7).num_hits > 30_000
    True
    """
    if n_particles < 0:
        raise ValueError(f"n_particles must be >= 0, got {n_particles}")
    if not 0.0 <= noise_fraction < 1.0:
        raise ValueError(f"noise_fraction must be in [0, 1), got {noise_fraction}")
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    r, phi, z, layer, particle = _particle_hits(n_particles, generator)
    n_noise = round(len(r) * noise_fraction / (1.0 - noise_fraction))
    noise = _noise_hits(n_noise, generator)
    r, phi, z, layer = (torch.cat([a, b]) for a, b in zip((r, phi, z, layer), noise, strict=True))
    particle = torch.cat([particle, torch.zeros(n_noise, dtype=torch.int64)])
    order = torch.randperm(len(r), generator=generator)
    features = torch.stack([r / 1000.0, phi / math.pi, z / 1000.0], dim=1).float()
    return Event(features[order].contiguous(), particle[order], layer[order])


def _particle_hits(
    n: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hits of ``n`` particles as flat float64 ``r, phi, z`` (mm, rad) and int64 layer, id."""

    def uniform(low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, 1, dtype=torch.float64, generator=generator)

    # pT ~ 1 / pT^2 between the bounds: inverse transform of a uniform number
    low, high = PT_RANGE_GEV
    pt = 1.0 / (1.0 / low - uniform(0.0, 1.0) * (1.0 / low - 1.0 / high))
    charge = torch.randint(0, 2, (n, 1), generator=generator).double() * 2.0 - 1.0
    phi0 = uniform(-math.pi, math.pi)
    eta = uniform(-ETA_MAX, ETA_MAX)
    z0 = VERTEX_SIGMA_Z_MM * torch.randn(n, 1, dtype=torch.float64, generator=generator)

    radii = torch.tensor(LAYER_RADII_MM, dtype=torch.float64).expand(n, -1)
    curvature_radius = pt / (0.3 * B_FIELD_T) * 1000.0  # mm
    reaches = radii < 2.0 * curvature_radius
    turn = torch.asin(torch.clamp(radii / (2.0 * curvature_radius), max=1.0))
    phi = phi0 - charge * turn
    z = z0 + 2.0 * curvature_radius * turn * torch.sinh(eta)
    inside = reaches & (z.abs() < HALF_LENGTH_MM)
    hit = torch.cumprod(inside.long(), dim=1).bool()  # stops at the first layer it misses

    pixel = torch.arange(len(LAYER_RADII_MM)) < _PIXEL_LAYERS
    sigma_rphi = torch.where(pixel, *_SIGMA_RPHI_MM).double()
    sigma_z = torch.where(pixel, *_SIGMA_Z_MM).double()
    phi = phi + sigma_rphi / radii * torch.randn(
        phi.shape, dtype=torch.float64, generator=generator
    )
    z = z + sigma_z * torch.randn(z.shape, dtype=torch.float64, generator=generator)
    layer = torch.arange(len(LAYER_RADII_MM)).expand(n, -1)
    particle = torch.arange(1, n + 1).unsqueeze(1).expand(-1, len(LAYER_RADII_MM))
    return radii[hit], _wrap(phi[hit]), z[hit], layer[hit], particle[hit]


def _noise_hits(
    n: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    layer = torch.randint(0, len(LAYER_RADII_MM), (n,), generator=generator)
    r = torch.tensor(LAYER_RADII_MM, dtype=torch.float64)[layer]
    phi = (2.0 * torch.rand(n, dtype=torch.float64, generator=generator) - 1.0) * math.pi
    z = (2.0 * torch.rand(n, dtype=torch.float64, generator=generator) - 1.0) * HALF_LENGTH_MM
    return r, phi, z, layer


def _wrap(phi: torch.Tensor) -> torch.Tensor:
    """Angles into [-pi, pi)."""
    return torch.remainder(phi + math.pi, 2.0 * math.pi) - math.pi


def true_edges(event: Event) -> torch.Tensor:
    """The truth graph ``[2, E]`` int64: each particle's consecutive hits, ordered by radius.

    Row 0 holds the inner hit, row 1 the next hit of the same particle outwards; edges come
    particle by particle. Noise hits have none.

    >>> edges = true_edges(generate_event(40, seed=1))
    """
    signal = torch.nonzero(event.particle_id > 0).squeeze(1)
    # by particle, then by layer (= by radius in a barrel): two stable sorts
    signal = signal[torch.sort(event.layer[signal], stable=True).indices]
    signal = signal[torch.sort(event.particle_id[signal], stable=True).indices]
    same = event.particle_id[signal[1:]] == event.particle_id[signal[:-1]]
    return torch.stack([signal[:-1][same], signal[1:][same]])
