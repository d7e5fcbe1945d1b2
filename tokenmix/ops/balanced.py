"""Fit a causal kernel with a few damped complex exponentials: balanced truncation of its Hankel operator.

A kernel g_0 .. g_(L-1) (one channel) is the impulse response of a finite-impulse system whose Hankel
operator is the L x L matrix H_ij = g_(i+j) (zero past the kernel's end): symmetric, so its
eigendecomposition H = Q diag(lambda) Q^T gives the Hankel singular values sigma = |lambda|. Balanced
truncation to order N (Kung's realization from the SVD, as in ERA) keeps the N largest:

    A = S^-1/2 U^T H_up V S^-1/2,  B = S^1/2 V[0]^T,  C = U[0] S^1/2,   g_j ~ C A^j B

with U = Q_N, V = Q_N sign(lambda_N), S = diag(sigma_N) and H_up the Hankel matrix of g_1, g_2, ....
Its modes are A's eigenvalues p (|p| < 1: balanced truncation keeps a stable system stable) with
residues r = (C T) (T^-1 B) for A = T diag(p) T^-1, so g_j ~ Re sum_n r_n p_n^j. The error over
every lag obeys the classical bound ||g - g_N||_2 <= ||G - G_N||_Hinf <= 2 sum_(i > N) sigma_i
(Glover 1984; the Hankel-norm theory LaughingHyena distils by, Massaroli et al. 2023, arXiv
2310.18780, §3.2). The residues are then refitted by least squares over the L lags with the poles
fixed, which can only lower the error there. Everything runs in float64, batched over channels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .modal import modal_kernel

STABILITY_MARGIN = 1e-9  # a pole that rounding puts on or past the unit circle is pulled in to 1 - this


@dataclass
class ModalFit:
    """Per channel: poles and residues (channels, order) complex128; the Hankel singular values
    (channels, L) in decreasing order; the bound 2 sum_(i > order) sigma_i on the error's l2 norm."""

    poles: torch.Tensor
    residues: torch.Tensor
    singular_values: torch.Tensor
    bound: torch.Tensor

    def kernel(self, n: int) -> torch.Tensor:
        """The fitted kernel at lags 0 .. n-1, (n, channels) float64."""
        return modal_kernel(self.poles, self.residues, n)


def hankel_matrices(kernel: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """(channels, L, L) Hankel matrices H_ij = g_(i+j+shift) of kernels (L, channels), zero past the end."""
    length = kernel.shape[0]
    index = torch.arange(length, device=kernel.device)
    index = index[:, None] + index[None, :] + shift
    padded = torch.cat([kernel.t(), kernel.new_zeros(kernel.shape[1], length + shift)], dim=1)
    return padded[:, index]


def hankel_singular_values(kernel: torch.Tensor) -> torch.Tensor:
    """sigma_1 >= sigma_2 >= ... of each channel's Hankel operator, (channels, L), from kernels (L, channels)."""
    return torch.linalg.eigvalsh(hankel_matrices(kernel.double())).abs().sort(dim=-1, descending=True).values


@dataclass
class HankelSpectrum:
    """Each channel's Hankel eigenpairs, ranked by |lambda| (the Hankel singular values) in decreasing order:
    computed once, truncated at any order (``truncate``)."""

    kernel: torch.Tensor  # (L, channels) float64
    eigenvalues: torch.Tensor  # (channels, L)
    vectors: torch.Tensor  # (channels, L, L), column i the eigenvector of eigenvalue i
    shifted: torch.Tensor  # (channels, L, L): the Hankel matrices of g_1, g_2, ...

    @property
    def singular_values(self) -> torch.Tensor:
        return self.eigenvalues.abs()

    def truncate(self, order: int) -> ModalFit:
        """Balanced truncation to ``order`` modes, residues refitted by least squares over the L lags
        (see the module docstring)."""
        length = self.kernel.shape[0]
        if not 1 <= order <= length:
            raise ValueError(f"order must be between 1 and the kernel's {length} lags, got {order}")
        sigma = self.singular_values
        u = self.vectors[:, :, :order]  # (channels, L, N)
        v = u * self.eigenvalues[:, None, :order].sign()
        root = sigma[:, :order].clamp_min(torch.finfo(torch.float64).tiny).sqrt()
        a = (u.transpose(1, 2) @ self.shifted @ v) / (root[:, :, None] * root[:, None, :])
        b, c = root * v[:, 0], u[:, 0] * root
        poles, modes = torch.linalg.eig(a)
        residues = (c.to(modes.dtype)[:, None, :] @ modes)[:, 0] * torch.linalg.solve(modes, b.to(modes.dtype)[..., None])[..., 0]
        poles = stable(poles)
        residues = refit_residues(self.kernel, poles, residues)
        return ModalFit(poles, residues, sigma, 2 * sigma[:, order:].sum(dim=-1))


def hankel_spectrum(kernel: torch.Tensor) -> HankelSpectrum:
    """The ranked eigendecomposition of each channel's Hankel matrix, from kernels (L, channels)."""
    kernel = kernel.double()
    eigenvalues, vectors = torch.linalg.eigh(hankel_matrices(kernel))
    ranked = eigenvalues.abs().argsort(dim=-1, descending=True)
    vectors = vectors.gather(-1, ranked[:, None, :].expand_as(vectors))
    return HankelSpectrum(kernel, eigenvalues.gather(-1, ranked), vectors, hankel_matrices(kernel, shift=1))


def balanced_modes(kernel: torch.Tensor, order: int) -> ModalFit:
    """Balanced truncation of each channel of ``kernel`` (L, channels) to ``order`` modes (``HankelSpectrum.truncate``)."""
    return hankel_spectrum(kernel).truncate(order)


def stable(poles: torch.Tensor) -> torch.Tensor:
    """Poles with magnitudes in [tiny, 1 - STABILITY_MARGIN] (unchanged where they are already)."""
    magnitude = poles.abs().clamp(torch.finfo(torch.float64).tiny, 1.0 - STABILITY_MARGIN)
    return torch.polar(magnitude, poles.angle())


def refit_residues(kernel: torch.Tensor, poles: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Residues r minimising sum_l (g_l - Re sum_n r_n p_n^l)^2 per channel with the poles fixed (real least
    squares over Re r and Im r); ``start``'s where the refit would not lower the error (rank-deficient sets)."""
    length = kernel.shape[0]
    powers = torch.exp(poles.log()[..., None] * torch.arange(length, dtype=torch.float64, device=poles.device))  # (channels, N, L)
    design = torch.cat([powers.real, -powers.imag], dim=1).transpose(1, 2)  # (channels, L, 2N)
    solution = torch.linalg.lstsq(design, kernel.t()[..., None], driver="gelsd").solution[..., 0]
    order = poles.shape[1]
    refit = torch.complex(solution[:, :order], solution[:, order:])

    def error(residues):
        return (modal_kernel(poles, residues, length) - kernel).square().sum(dim=0)

    return torch.where((error(refit) <= error(start))[:, None], refit, start)
