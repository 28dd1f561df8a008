"""Kalman smoothing, and its likelihood and gradient, as ONE block-tridiagonal solve per pass.

    python examples/kalman_smoother.py [--quick] [--out figures/]

Model: a noisy damped oscillator observed through its position (the state-space form of a
Gaussian process), state x_t = (position, velocity), t = 0 .. T-1, time step DT:

    dx = A x dt + q e_2 dW,  A = [[0, 1], [-OMEGA^2, -GAMMA]],  sampled exactly every DT:
    x_0 ~ N(0, P0),   x_t = F x_{t-1} + w_t,   w_t ~ N(0, Q),   F = exp(A DT),   Q = q^2 Q_1,
    y_t = H x_t + v_t,   v_t ~ N(0, r^2),   H = [1, 0]            (the position, with noise)

with P0 = q^2 P_1 the stationary covariance (so the tracks stay O(1): no digits are lost to a
drifting position) and Q_1, P_1 the unit-noise covariances (Van Loan's matrix exponential).
The states of a track are jointly Gaussian; given its observations y they have precision

    J = J_prior + H^T R^-1 H,   J_prior (the Markov chain):  J[t, t] = Q^-1 + F^T Q^-1 F  (P0^-1 +
    F^T Q^-1 F at t = 0, Q^-1 at t = T-1),  J[t, t-1] = -Q^-1 F,  J[t-1, t] = J[t, t-1]^T,

block tridiagonal with 2 x 2 blocks along the time axis, and mean J^-1 h with h = H^T R^-1 y.
So the smoothed means of every track are ONE `tridiax.solveh_block_tridiagonal(lower, diag, h)`
call: J is symmetric positive definite and the same for every track (blocks of shape (T, 2, 2),
broadcast against h of shape (tracks, T, 2); the block rows are the time axis, the last of the
batch-and-row dimensions).

The marginal log-likelihood log p(y) = -1/2 (y^T S^-1 y + log|S| + n log 2 pi), S = cov(y),
comes from the same solve: y^T S^-1 y = y^T R^-1 y - h^T J^-1 h (Woodbury), and
log|S| = log|R| + log|J| - log|J_prior| (the matrix determinant lemma), with log|J| from a
block Cholesky (Schur-complement) scan over time and log|J_prior| = -log|P0| - (T-1) log|Q|
(the chain's increments are independent). Everything is checked against a textbook Kalman
filter and Rauch-Tung-Striebel smoother in NumPy (float64): the means to 1e-8, the
log-likelihood against the filter's innovation form.

Then the gradient of the log-likelihood with respect to theta = (log q, log r), through the
solve (implicit differentiation) and the scan, against a finite difference, and a fit of
(q, r) to simulated tracks by Adam from a wrong start. Finally the smoother is timed against
the NumPy one at full size (1000 tracks of 10 000 steps).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from _common import adam, best_time, parse_args, save_figure

import tridiax

DT, OMEGA, GAMMA = 0.1, 1.0, 0.2
A = np.array([[0.0, 1.0], [-OMEGA**2, -GAMMA]])


def unit_noise_discretisation():
    """F = exp(A DT) and Q_1 = int_0^DT exp(A s) e_2 e_2^T exp(A s)^T ds, by Van Loan's method."""
    block = np.zeros((4, 4))
    block[:2, :2], block[:2, 2:], block[2:, 2:] = -A, np.diag([0.0, 1.0]), A.T
    exponential = scipy.linalg.expm(block * DT)
    transition = exponential[2:, 2:].T
    return transition, transition @ exponential[:2, 2:]


F, Q_UNIT = unit_noise_discretisation()  # NumPy arrays: constants of the traced functions
P_UNIT = np.diag([1 / (2 * GAMMA * OMEGA**2), 1 / (2 * GAMMA)])  # A P + P A^T + e_2 e_2^T = 0
H = np.array([1.0, 0.0])
THETA_TRUE = np.log([1.0, 0.5])  # (log q, log r)
THETA_START = np.log([0.2, 2.0])


def solveh_blocks(lower, diag, rhs):
    """J x = rhs along the time axis: blocks (T, 2, 2) shared by the tracks, rhs (tracks, T, 2)."""
    return tridiax.solveh_block_tridiagonal(lower, diag, rhs)


def precision_blocks(theta, steps: int):
    """lower[t] = J[t, t-1] and diag[t] = J[t, t], each (steps, 2, 2): shared by the tracks."""
    q, r = jnp.exp(theta[0]), jnp.exp(theta[1])
    q_inv = jnp.asarray(np.linalg.inv(Q_UNIT)) / q**2
    transition = q_inv @ jnp.asarray(F)  # Q^-1 F
    observed = jnp.asarray(np.outer(H, H)) / r**2  # H^T R^-1 H
    middle = q_inv + jnp.asarray(F).T @ transition + observed
    diag = jnp.broadcast_to(middle, (steps, 2, 2))
    diag = diag.at[0].add(jnp.asarray(np.linalg.inv(P_UNIT)) / q**2 - q_inv)  # P0^-1, not Q^-1
    diag = diag.at[-1].add(-jnp.asarray(F).T @ transition)  # no F^T Q^-1 F at the end
    lower = jnp.broadcast_to(-transition, (steps, 2, 2))  # lower[0] is ignored
    return lower, diag


def block_logdet(lower, diag):
    """log|J| for a symmetric positive definite block-tridiagonal J (blocks (T, k, k)), by
    the Schur complements S_0 = D_0, S_t = D_t - L_t S_{t-1}^-1 L_t^T and their Cholesky factors."""

    def step(chol, blocks):
        low, d = blocks
        w = jax.scipy.linalg.solve_triangular(chol, jnp.swapaxes(low, -1, -2), lower=True)
        chol = jnp.linalg.cholesky(d - jnp.swapaxes(w, -1, -2) @ w)
        return chol, 2 * jnp.sum(jnp.log(jnp.diagonal(chol)))

    first = jnp.linalg.cholesky(diag[0])
    _, logs = jax.lax.scan(step, first, (lower[1:], diag[1:]))
    return 2 * jnp.sum(jnp.log(jnp.diagonal(first))) + jnp.sum(logs)


def smooth(theta, y):
    """Smoothed means (tracks, T, 2) for observations y (tracks, T), and log p(y) summed over
    the tracks."""
    tracks, steps = y.shape
    log_q, log_r = theta[0], theta[1]
    lower, diag = precision_blocks(theta, steps)
    h = y[..., None] * jnp.asarray(H) * jnp.exp(-2 * log_r)  # H^T R^-1 y, (tracks, T, 2)
    mean = solveh_blocks(lower, diag, h)
    quadratic = jnp.sum(y**2) * jnp.exp(-2 * log_r) - jnp.sum(h * mean)  # y^T S^-1 y (Woodbury)
    # log|J_prior| = -log|P0| - (T-1) log|Q|, with log|q^2 M| = 4 log q + log|M| (2 x 2)
    log_prior = (-(4 * log_q + np.linalg.slogdet(P_UNIT)[1])
                 - (steps - 1) * (4 * log_q + np.linalg.slogdet(Q_UNIT)[1]))
    log_s = 2 * steps * log_r + block_logdet(lower, diag) - log_prior  # per track
    log_likelihood = -0.5 * (quadratic + tracks * (log_s + steps * np.log(2 * np.pi)))
    return mean, log_likelihood


def simulate(theta, steps: int, tracks: int, seed: int = 0):
    """States (tracks, T, 2) and observations (tracks, T) drawn from the model."""
    q, r = np.exp(theta)
    rng = np.random.default_rng(seed)
    x = np.empty((steps, tracks, 2))
    x[0] = rng.standard_normal((tracks, 2)) @ (q * np.linalg.cholesky(P_UNIT)).T
    noise = rng.standard_normal((steps, tracks, 2)) @ (q * np.linalg.cholesky(Q_UNIT)).T
    for t in range(1, steps):
        x[t] = x[t - 1] @ F.T + noise[t]
    y = x[..., 0] + r * rng.standard_normal((steps, tracks))
    return np.ascontiguousarray(x.transpose(1, 0, 2)), np.ascontiguousarray(y.T)


def kalman_rts(theta, y):
    """Textbook Kalman filter + Rauch-Tung-Striebel smoother in NumPy, every track at once (the
    covariances do not depend on the data, so they are shared), for observations y (tracks, T).
    Returns the smoothed means (tracks, T, 2), their position variances (T,) and log p(y) summed
    over tracks (innovation form: sum_t log N(e_t; 0, s_t))."""
    q, r = np.exp(theta)
    tracks, steps = y.shape
    y = y.T  # time-major for the loop over time
    Q, R = q**2 * Q_UNIT, r**2
    m_pred, m_filt = np.empty((steps, tracks, 2)), np.empty((steps, tracks, 2))
    P_pred, P_filt = np.empty((steps, 2, 2)), np.empty((steps, 2, 2))
    m, P, log_likelihood = np.zeros((tracks, 2)), q**2 * P_UNIT, 0.0
    for t in range(steps):
        if t > 0:
            m, P = m @ F.T, F @ P @ F.T + Q
        m_pred[t], P_pred[t] = m, P
        s = H @ P @ H + R  # innovation variance
        gain = P @ H / s
        e = y[t] - m @ H  # innovations, (tracks,)
        m, P = m + e[:, None] * gain, P - s * np.outer(gain, gain)
        m_filt[t], P_filt[t] = m, P
        log_likelihood -= 0.5 * (tracks * np.log(2 * np.pi * s) + np.sum(e**2) / s)
    m_smooth, P_smooth = np.empty_like(m_filt), np.empty_like(P_filt)
    m_smooth[-1], P_smooth[-1] = m_filt[-1], P_filt[-1]
    for t in range(steps - 2, -1, -1):
        G = P_filt[t] @ F.T @ np.linalg.inv(P_pred[t + 1])
        m_smooth[t] = m_filt[t] + (m_smooth[t + 1] - m_pred[t + 1]) @ G.T
        P_smooth[t] = P_filt[t] + G @ (P_smooth[t + 1] - P_pred[t + 1]) @ G.T
    return m_smooth.transpose(1, 0, 2), P_smooth[:, 0, 0], log_likelihood


def main():
    args = parse_args(__doc__)
    jax.config.update("jax_enable_x64", True)
    steps, tracks = (500, 20) if args.quick else (10_000, 1000)
    fit_steps, fit_tracks, iterations = (500, 20, 60) if args.quick else (10_000, 100, 60)

    print(f"damped oscillator (omega {OMEGA}, gamma {GAMMA}) sampled every DT = {DT}; "
          f"true q = {np.exp(THETA_TRUE[0]):.3f}, r = {np.exp(THETA_TRUE[1]):.3f}")
    states, y = simulate(THETA_TRUE, steps, tracks)
    smooth_jit = jax.jit(smooth)
    mean, log_likelihood = smooth_jit(jnp.asarray(THETA_TRUE), jnp.asarray(y))
    mean = np.asarray(mean)
    numpy_time = float("inf")
    for _ in range(2):  # best of 2
        start = time.perf_counter()
        reference, variance, reference_log_likelihood = kalman_rts(THETA_TRUE, y)
        numpy_time = min(numpy_time, time.perf_counter() - start)

    difference = np.max(np.abs(mean - reference))
    print(f"{tracks} tracks of {steps} steps, smoothed means by one block-tridiagonal solve "
          f"(blocks ({steps}, 2, 2), h ({tracks}, {steps}, 2)):")
    print(f"  max |mean - Kalman/RTS mean| = {difference:.1e} (largest |mean| "
          f"{np.max(np.abs(reference)):.1e})")
    relative = abs(float(log_likelihood) - reference_log_likelihood) / abs(reference_log_likelihood)
    print(f"  log-likelihood: block solve + Schur scan {float(log_likelihood):.10e}, "
          f"Kalman filter {reference_log_likelihood:.10e}, relative difference {relative:.1e}")
    assert difference < 1e-8, "the smoothed means differ from the Kalman/RTS smoother"
    assert relative < 1e-8, "the log-likelihoods differ"

    # Timing (the same data and parameters): the means alone (the blocks and one solve), and
    # with the log-likelihood (the Schur scan too), against NumPy's filter and smoother.
    theta_y = jnp.asarray(THETA_TRUE), jnp.asarray(y)
    _, means_time = best_time(jax.jit(lambda theta, y: smooth(theta, y)[0]), *theta_y, repeats=3)
    _, block_time = best_time(smooth_jit, *theta_y, repeats=3)
    print(f"  time, best of 3: smoothed means by the block solve {1e3 * means_time:.3g} ms; "
          f"means + log-likelihood {1e3 * block_time:.3g} ms; NumPy Kalman filter + RTS smoother "
          f"(means, variances, log-likelihood) {1e3 * numpy_time:.3g} ms "
          f"({numpy_time / means_time:.1f}x the block solve)")

    # The gradient of the log-likelihood per observation w.r.t. theta = (log q, log r).
    _, y_fit = simulate(THETA_TRUE, fit_steps, fit_tracks, seed=1)
    y_fit = jnp.asarray(y_fit)

    def objective(theta):
        return smooth(theta, y_fit)[1] / y_fit.size

    value_and_grad = jax.jit(jax.value_and_grad(objective))
    value_of = jax.jit(objective)
    theta0 = jnp.asarray(THETA_START)
    _, gradient = value_and_grad(theta0)
    step = 1e-4  # central difference: truncation ~ step^2; rounding (~1e-11 relative here) / step
    for k, name in enumerate(("log q", "log r")):
        bump = jnp.zeros(2).at[k].set(step)
        finite = (value_of(theta0 + bump) - value_of(theta0 - bump)) / (2 * step)
        print(f"d loglik / d {name} (per observation, at the start): autodiff {gradient[k]:.8e}, "
              f"finite difference {finite:.8e}")
        assert abs(gradient[k] - finite) < 1e-5 * abs(finite), "gradient check failed"

    # Fit (q, r) to fresh tracks by Adam on the negative log-likelihood, from a wrong start.
    print(f"fit (q, r) to {fit_tracks} simulated tracks of {fit_steps} steps by Adam, "
          f"{iterations} iterations:")
    init, update = adam(learning_rate=0.1, b1=0.5)  # little momentum: no overshoot

    @jax.jit
    def ascend(theta, state):
        value, gradient = jax.value_and_grad(objective)(theta)
        return value, *update(-gradient, state, theta)

    theta, state, history = theta0, init(theta0), []
    for iteration in range(iterations + 1):
        value, new_theta, new_state = ascend(theta, state)
        history.append((float(value), *np.exp(np.asarray(theta))))
        if iteration % (iterations // 6) == 0 or iteration == iterations:
            print(f"  iteration {iteration:4d}  loglik per observation {float(value):.6f}  "
                  f"q {history[-1][1]:.4f}  r {history[-1][2]:.4f}")
        if iteration < iterations:
            theta, state = new_theta, new_state
    history = np.asarray(history)
    q_true, r_true = np.exp(THETA_TRUE)
    print(f"q: {history[0, 1]:.4f} -> {history[-1, 1]:.4f} (true {q_true:.4f}); "
          f"r: {history[0, 2]:.4f} -> {history[-1, 2]:.4f} (true {r_true:.4f})")
    print(f"loglik per observation: {history[0, 0]:.6f} -> {history[-1, 0]:.6f} "
          f"(at the true parameters {float(value_of(jnp.asarray(THETA_TRUE))):.6f})")
    for k in range(2):
        assert abs(np.log(history[-1, k + 1]) - THETA_TRUE[k]) < 0.2 * abs(
            THETA_START[k] - THETA_TRUE[k]), "the fit did not recover the parameters"

    window = slice(0, min(steps, 300))
    print(f"figure: track 0, steps {window.start}..{window.stop - 1} (true position, observations, "
          f"smoothed mean +- 2 sd), and the fit's (q, r) and log-likelihood by iteration")

    def draw(figure):
        left, middle, right = figure.subplots(1, 3, width_ratios=(2, 1, 1))
        t = DT * np.arange(steps)[window]
        left.plot(t, y[0, window], ".", ms=3, color="0.6", label="observations")
        left.plot(t, states[0, window, 0], "k-", lw=1, label="true position")
        sd = 2 * np.sqrt(variance[window])
        left.plot(t, mean[0, window, 0], "C0-", lw=1.2, label="smoothed mean")
        left.fill_between(t, mean[0, window, 0] - sd, mean[0, window, 0] + sd, color="C0",
                          alpha=0.25, lw=0, label="+- 2 sd")
        left.set(xlabel="time", ylabel="position", title="a track, smoothed by one block solve")
        left.legend(fontsize=8)
        for k, (name, truth) in enumerate((("q", q_true), ("r", r_true))):
            line, = middle.semilogy(history[:, k + 1], label=name)
            middle.axhline(truth, color=line.get_color(), ls=":", lw=1)
        middle.set(xlabel="Adam iteration", title="noise scales (dotted: true)")
        middle.legend(fontsize=8)
        right.plot(history[:, 0])
        right.set(xlabel="Adam iteration", title="log-likelihood per observation")

    save_figure(args.out, "kalman_smoother.png", draw, size=(12, 3.6))


if __name__ == "__main__":
    main()
