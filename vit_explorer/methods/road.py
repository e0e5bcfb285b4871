"""ROAD's noisy linear imputation (Rong et al., "A Consistent and Efficient Evaluation Strategy for Attribution
Methods", ICML 2022): what a removed pixel shows when removing must not itself tell the model something.

Blurring or greying a patch leaves a shape the model can see (the removal's own artefact); ROAD fills each removed
pixel with the weighted mean of its 8 neighbours (1/6 each orthogonal, 1/12 each diagonal; neighbours outside the
image dropped), the removed ones unknowns themselves, so the fill is the smooth interpolation of the kept pixels
around it, plus small Gaussian noise. That is one sparse linear system per image and channel; it is symmetric
positive definite wherever a removed region touches a kept pixel, and is solved here in float32 by
Jacobi-preconditioned conjugate gradients started from the same problem at half the resolution, all images and
channels at once (the reference solves each with a sparse direct solver; on 256² images this is 0.5–2× its time and
agrees with it to about 1e-4, a hundredth of the noise). A region with no kept pixel at all (everything removed) has
no neighbours to follow and becomes 0, the mean of the normalised input, plus the noise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# ROAD's neighbour weights (the reference's ``neighbors_weights``), as a 3×3 kernel
NEIGHBOUR_WEIGHTS = torch.tensor([[1 / 12, 1 / 6, 1 / 12], [1 / 6, 0.0, 1 / 6], [1 / 12, 1 / 6, 1 / 12]], dtype=torch.float64)
NOISE = 0.01  # the reference's noise: standard deviation in the units of the (normalised) input
TOLERANCE = 1e-5  # relative residual at which the solve stops: within ~1e-4 of an exact solve, far below the noise


def neighbour_sum(values: torch.Tensor) -> torch.Tensor:
    """Σ over the 8 neighbours of weight × value, for ``[..., H, W]`` (zero beyond the border)."""
    padded = F.pad(values, (1, 1, 1, 1))
    height, width = values.shape[-2:]
    total = torch.zeros_like(values)
    for dy in range(3):
        for dx in range(3):
            weight = float(NEIGHBOUR_WEIGHTS[dy, dx])
            if weight:
                total += weight * padded[..., dy : dy + height, dx : dx + width]
    return total


def impute(images: torch.Tensor, removed: torch.Tensor, noise: float = NOISE,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """``images`` ``[b, c, H, W]`` with the pixels where ``removed`` ``[b, 1, H, W]`` (bool) is set replaced by ROAD's
    noisy linear imputation; the kept pixels are unchanged."""
    kept = images.float() * ~removed
    solution = solve(kept, removed)
    if noise:
        solution = solution + noise * torch.randn(solution.shape, generator=generator, dtype=solution.dtype) * removed
    return torch.where(removed, solution, kept).to(images.dtype)


def solve(kept: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """The noiseless imputation ``[b, c, H, W]`` float32 of the ``removed`` pixels from the ``kept`` values (zero where
    removed), by conjugate gradients started from the same problem solved at half the resolution (cascadic
    multigrid): the coarse solution carries the smooth part that plain conjugate gradients are slow to spread."""
    height, width = kept.shape[-2:]
    guess = torch.zeros_like(kept)
    if min(height, width) >= 2 * COARSEST and bool(removed.any()):
        # a coarse pixel is kept where any of its fine pixels is, with their mean
        known = (~removed).float()
        known_share = F.avg_pool2d(known, 2, ceil_mode=True)
        coarse_kept = F.avg_pool2d(kept, 2, ceil_mode=True) / known_share.clamp_min(1e-12)
        coarse_removed = known_share == 0
        coarse = solve(coarse_kept * ~coarse_removed, coarse_removed)
        coarse = torch.where(coarse_removed, coarse, coarse_kept)
        guess = F.interpolate(coarse, scale_factor=2, mode="bilinear", align_corners=False)[..., :height, :width] * removed
    return conjugate_gradients(kept, removed, guess)


COARSEST = 8  # the pyramid stops above this many pixels on a side


def conjugate_gradients(kept: torch.Tensor, removed: torch.Tensor, guess: torch.Tensor,
                        max_iterations: int = 10_000) -> torch.Tensor:
    """Jacobi-preconditioned conjugate gradients on ROAD's system (module doc), from ``guess`` (zero where kept)."""
    unknown = removed.expand_as(kept).float()  # [b, c, H, W]: 1 where a value is solved for
    # per removed pixel i: s_i·x_i − Σ_{removed j} w_ij·x_j = Σ_{kept j} w_ij·v_j, s_i the weight of i's neighbours in the image
    diagonal = neighbour_sum(torch.ones_like(kept[:, :1])).expand_as(kept)

    def apply(x: torch.Tensor) -> torch.Tensor:
        return (diagonal * x - neighbour_sum(x)) * unknown

    rhs = neighbour_sum(kept) * unknown
    scale = rhs.pow(2).sum(dim=(2, 3), keepdim=True).sqrt()
    solution = guess * unknown
    residual = rhs - apply(solution)
    preconditioned = residual / diagonal
    direction = preconditioned.clone()
    rho = (residual * preconditioned).sum(dim=(2, 3), keepdim=True)
    for _ in range(max_iterations):
        if bool((residual.pow(2).sum(dim=(2, 3), keepdim=True).sqrt() <= TOLERANCE * scale).all()):
            break
        product = apply(direction)
        curvature = (direction * product).sum(dim=(2, 3), keepdim=True)
        alpha = torch.where(curvature > 0, rho / curvature.clamp_min(1e-30), torch.zeros_like(rho))
        solution = solution + alpha * direction
        residual = residual - alpha * product
        preconditioned = residual / diagonal
        rho_next = (residual * preconditioned).sum(dim=(2, 3), keepdim=True)
        beta = torch.where(rho > 0, rho_next / rho.clamp_min(1e-30), torch.zeros_like(rho))
        direction = preconditioned + beta * direction
        rho = rho_next
    return solution
