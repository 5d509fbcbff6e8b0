"""Levenberg–Marquardt least squares on the normal equations (Marquardt 1963; Moré 1978 §2).

The joint law fit has n runs and p parameters with n ≫ p. MINPACK's `lmder` (scipy's "lm") factors
the n × p Jacobian by an unblocked pivoted QR every iteration; forming JᵀJ of the column-scaled
Jacobian with one BLAS product and solving the p × p damped system does the same step at a fraction
of the cost, linear in n. (A QR-and-SVD step, at the precision of J rather than JᵀJ, was tried: it
took the same iterations to the same optimum on the ill-conditioned ladders of the tests.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class LsqResult:
    x: np.ndarray
    cost: float  # ½‖r‖²
    success: bool  # a tolerance was met (False: the iteration limit was reached first)


def levenberg_marquardt(fun: Callable[[np.ndarray], np.ndarray], jac: Callable[[np.ndarray], np.ndarray],
                        x0: np.ndarray, *, ftol: float = 1e-12, xtol: float = 1e-12, gtol: float = 1e-12,
                        max_iter: int = 200) -> LsqResult:
    """Minimise ½‖fun(x)‖². Columns of J scaled to unit norm (Marquardt's scaling), damping λ·I on
    the scaled normal equations, λ updated by the gain ratio (Nielsen 1999). Converged when the
    relative cost reduction (actual and predicted) is below ftol, the scaled step below xtol, or the
    scaled gradient below gtol; a step that no λ can make lower the cost is a minimum to rounding.
    Raises ValueError on a non-finite starting residual."""
    x = np.array(x0, float)
    r = fun(x)
    cost = 0.5 * float(r @ r)
    if not np.isfinite(cost):
        raise ValueError("non-finite residual at the starting point")
    lam, nu = 1e-3, 2.0
    for _ in range(max_iter):
        J = jac(x)
        d = np.sqrt(np.maximum(np.einsum("ij,ij->j", J, J), 1e-300))  # column norms: Marquardt's scaling
        Js = J / d
        A = Js.T @ Js  # unit diagonal: the scaling takes the parameters' units out of its condition number
        g = Js.T @ r
        if cost == 0.0 or np.max(np.abs(g)) <= gtol * np.sqrt(2.0 * cost):
            return LsqResult(x, cost, True)
        while True:
            try:
                u = np.linalg.solve(A + lam * np.eye(len(A)), -g)
            except np.linalg.LinAlgError:
                u = np.linalg.lstsq(A + lam * np.eye(len(A)), -g, rcond=None)[0]
            step = u / d
            x_new = x + step
            with np.errstate(over="ignore", invalid="ignore"):
                r_new = fun(x_new)
                cost_new = 0.5 * float(r_new @ r_new)
            pred = -float(g @ u + 0.5 * u @ A @ u)
            actual = cost - cost_new if np.isfinite(cost_new) else -np.inf
            if actual > 0 and pred > 0:
                break
            lam, nu = lam * nu, 2.0 * nu  # Nielsen's update: grow λ geometrically faster after each miss
            if lam > 1e16:  # no direction lowers the cost: a minimum to rounding
                return LsqResult(x, cost, True)
        rho = actual / pred
        small_f = actual <= ftol * cost and pred <= ftol * cost
        small_x = np.linalg.norm(u) <= xtol * (xtol + np.linalg.norm(d * x))
        x, r, cost = x_new, r_new, cost_new
        lam, nu = lam * max(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3), 2.0  # Nielsen (1999)
        if small_f or small_x:
            return LsqResult(x, cost, True)
    return LsqResult(x, cost, False)
