"""ROAD's noisy linear imputation (Rong et al., "A Consistent and Efficient Evaluation Strategy for Attribution
Methods", ICML 2022): what a removed pixel shows when removing must not itself tell the model something.

Blurring or greying a patch leaves a shape the model can see (the removal's own artefact); ROAD fills each removed
pixel with the weighted mean of its 8 neighbours (1/6 each orthogonal, 1/12 each diagonal; neighbours outside the
image dropped), the removed ones unknowns themselves, so the fill is the smooth interpolation of the kept pixels
around it, plus small Gaussian noise. That is one sparse linear system per image and channel; it is symmetric
positive definite wherever a removed region touches a kept pixel, and is solved here by Jacobi-preconditioned
conjugate gradients, all images and channels at once. A region with no kept pixel at all (everything removed) has
no neighbours to follow and becomes 0, the mean of the normalised input, plus the noise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# ROAD's neighbour weights (the reference's ``neighbors_weights``), as a 3×3 kernel
NEIGHBOUR_WEIGHTS = torch.tensor([[1 / 12, 1 / 6, 1 / 12], [1 / 6, 0.0, 1 / 6], [1 / 12, 1 / 6, 1 / 12]], dtype=torch.float64)
NOISE = 0.01  # the reference's noise: standard deviation in the units of the (normalised) input
TOLERANCE = 1e-6  # relative residual at which the solve stops (the imputation is then within ~1e-5 of an exact solve)


def neighbour_sum(values: torch.Tensor) -> torch.Tensor:
    """Σ over the 8 neighbours of weight × value, for ``[b, c, H, W]`` (zero beyond the border)."""
    channels = values.shape[1]
    kernel = NEIGHBOUR_WEIGHTS.to(values.dtype).expand(channels, 1, 3, 3)
    return F.conv2d(values, kernel, padding=1, groups=channels)


def impute(images: torch.Tensor, removed: torch.Tensor, noise: float = NOISE, generator: torch.Generator | None = None,
           max_iterations: int = 10_000) -> torch.Tensor:
    """``images`` ``[b, c, H, W]`` with the pixels where ``removed`` ``[b, 1, H, W]`` (bool) is set replaced by ROAD's
    noisy linear imputation; the kept pixels are unchanged."""
    dtype = images.dtype
    x_kept = images.double() * ~removed
    unknown = removed.expand_as(x_kept).double()  # [b, c, H, W]: 1 where a value is solved for
    # the system, per removed pixel i: s_i·x_i − Σ_{removed j} w_ij·x_j = Σ_{kept j} w_ij·v_j, with s_i the weight of
    # i's neighbours inside the image
    diagonal = neighbour_sum(torch.ones_like(x_kept[:, :1])).expand_as(x_kept)

    def apply(x: torch.Tensor) -> torch.Tensor:
        return (diagonal * x - neighbour_sum(x)) * unknown

    rhs = neighbour_sum(x_kept) * unknown
    solution = torch.zeros_like(x_kept)
    residual = rhs.clone()
    preconditioned = residual / diagonal
    direction = preconditioned.clone()
    rho = (residual * preconditioned).sum(dim=(2, 3), keepdim=True)
    scale = rhs.pow(2).sum(dim=(2, 3), keepdim=True).sqrt()
    for _ in range(max_iterations):
        if bool((residual.pow(2).sum(dim=(2, 3), keepdim=True).sqrt() <= TOLERANCE * scale).all()):
            break
        product = apply(direction)
        curvature = (direction * product).sum(dim=(2, 3), keepdim=True)
        alpha = torch.where(curvature > 0, rho / curvature.clamp_min(1e-300), torch.zeros_like(rho))
        solution = solution + alpha * direction
        residual = residual - alpha * product
        preconditioned = residual / diagonal
        rho_next = (residual * preconditioned).sum(dim=(2, 3), keepdim=True)
        beta = torch.where(rho > 0, rho_next / rho.clamp_min(1e-300), torch.zeros_like(rho))
        direction = preconditioned + beta * direction
        rho = rho_next
    if noise:
        solution = solution + noise * torch.randn(solution.shape, generator=generator, dtype=solution.dtype) * unknown
    return (x_kept + solution * unknown).to(dtype)
