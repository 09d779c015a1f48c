"""The model's own error, estimated out of sample, so that a band covers what its level says.

A validation row predicts a measured efficiency at k from what did not run there. Its
error on the log scale, e = log(predicted / measured) (the relative error of the step
time), is taken as N(0, v + tau^2): v the row's own noise (the variance of its bootstrap
draws: the inputs resampled and, where it is known, the spread of the measured mean), and
tau^2 the model's misfit, the same for the rows of a pool. For a row r, tau is estimated
from rows that do not touch r (a nested leave-out: no row's band is set by its own error):

  own     the machine's rows at other k that read nothing of r's measured point (by the
          logs of what they read, inputs.Reading), where there are MIN_ROWS of them;
  pooled  else those and every row of the committed machines (a fixed set shipped with
          the project: a machine's answer never depends on what else is on the command
          line), less the committed copy's rows at r's k.

tau^2 by maximum likelihood over the pool (scipy.optimize.minimize_scalar; a row whose
measurement was made once has no known noise: its whole error counts as misfit). The band
is each draw of the row's model times exp(tau T), T a Student t with nu = the pool's rows
(tau is estimated from nu residuals), percentiles at the band's level.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats as sps

# Fewer than 3 residuals: Student's t at 90% with 1 or 2 degrees of freedom is 6.3 or 2.9
# (against 1.64): a band set by the estimate's own uncertainty, not by the misfit. Fixed
# before any coverage was computed (issue #44), not tuned.
MIN_ROWS = 3


@dataclass(frozen=True)
class Residual:
    """One validation row's out-of-sample error, what it read, and its own noise."""
    machine: str            # an identity of the machine's results (report.forecast.identity)
    series: str
    scaling: str
    k: int
    error_log: float        # log(predicted / measured)
    noise_var: float        # variance of log(predicted) over its draws (measured mean's spread where known)
    reads: frozenset        # (kind, k, what) of everything the row read

    def touches(self, series: str, scaling: str, k: int, machine: str) -> bool:
        """This row is at k on that machine, or read that machine's throughput at k (its
        measured point): it may not set that point's band."""
        if machine != self.machine:
            return False
        return self.k == k or ("throughput", k, scaling) in self.reads and self.series == series


def tau_mle(errors, variances) -> float:
    """tau maximising sum log N(e_j; 0, v_j + tau^2) (0: the errors are the noise's)."""
    e, v = np.asarray(errors, float) ** 2, np.asarray(variances, float)
    if not len(e):
        return 0.0

    def nll(tau):
        s = v + tau ** 2
        return float(np.sum(np.log(np.maximum(s, 1e-300)) + e / np.maximum(s, 1e-300)))
    hi = float(np.sqrt(np.max(e))) * 10 + 1e-6
    res = optimize.minimize_scalar(nll, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-7})
    return float(res.x) if nll(res.x) < nll(0.0) else 0.0


def pool(series: str, scaling: str, k: int | None, machine: str, own: list[Residual],
         committed: list[Residual]) -> tuple[list[Residual], str]:
    """The rows that may set the misfit of a point (k None: the grid, any k), and which:
    the machine's own rows that do not touch it where there are MIN_ROWS, else those and
    the committed machines' rows (this machine's committed copy only where it does not
    touch the point either)."""
    mine = [r for r in own if k is None or not r.touches(series, scaling, k, machine)]
    if len(mine) >= MIN_ROWS:
        return mine, f"this machine's {len(mine)} rows" + (f" at k other than {k}" if k is not None else "")
    others = [r for r in committed if r.machine != machine]
    return mine + others, (f"pooled: {len(others)} rows of the committed machines and {len(mine)} of this "
                           f"machine's (fewer than {MIN_ROWS} of its own)")


def estimate(rows: list[Residual]) -> tuple[float, int]:
    """(tau, nu) of a pool."""
    return tau_mle([r.error_log for r in rows], [r.noise_var for r in rows]), len(rows)


def widen(log_draws, tau: float, nu: int, rng) -> np.ndarray:
    """Each draw's log prediction with the misfit on top: + tau T_nu."""
    d = np.asarray(log_draws, float)
    if tau <= 0 or nu < 1:
        return d
    return d + tau * sps.t.rvs(df=nu, size=len(d), random_state=rng)
