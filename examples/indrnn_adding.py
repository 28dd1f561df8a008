"""Train a two-layer tridiax.IndRNN (Equinox) on the adding problem.

    python examples/indrnn_adding.py [--quick] [--out figures/] [--length 200] [--epochs 10]

Each input is a sequence of T pairs (value ~ U(0, 1), marker); exactly two markers are 1, one in
each half of the sequence, and the target is the sum of the two marked values. Always answering 1
gives a mean squared error of 1/6 = 0.167 (the variance of the sum), so a model beats that only by
carrying a value across up to T steps. Each IndRNN layer is one matmul plus one recurrence kernel
per sequence (`jax.vmap` over the batch); gradients run the reverse-time recurrence. Prints one
line per epoch: the training MSE and the MSE on held-out sequences, against the 0.167 baseline.
"""

import time

import equinox as eqx
import jax
import jax.numpy as jnp
from _common import adam, parse_args, save_figure

import tridiax

BASELINE = 1 / 6  # MSE of always answering 1


def adding_problem(key, batch: int, length: int):
    """Inputs (batch, length, 2) and targets (batch,)."""
    value_key, first_key, second_key = jax.random.split(key, 3)
    values = jax.random.uniform(value_key, (batch, length))
    half = length // 2
    first = jax.random.randint(first_key, (batch,), 0, half)
    second = jax.random.randint(second_key, (batch,), half, length)
    positions = jnp.arange(length)
    markers = ((positions == first[:, None]) | (positions == second[:, None])).astype(values.dtype)
    return jnp.stack([values, markers], axis=-1), jnp.sum(values * markers, axis=1)


class AddingModel(eqx.Module):
    """IndRNN layers, then a linear read-out of the last hidden state."""

    layers: list[tridiax.IndRNN]
    head: eqx.nn.Linear

    def __init__(self, hidden: int, depth: int, length: int, *, key):
        keys = jax.random.split(key, depth + 2)
        layers = [tridiax.IndRNN(2 if i == 0 else hidden, hidden, key=keys[i])
                  for i in range(depth)]
        # IndRNN paper, adding problem: the last layer's recurrent weights start in
        # (2^(-10/T), 1) so that its units can remember for about T steps from the start.
        long_memory = jax.random.uniform(keys[-2], (hidden,), minval=2 ** (-10 / length),
                                         maxval=1.0)
        layers[-1] = eqx.tree_at(lambda layer: layer.weight_hh, layers[-1], long_memory)
        self.layers = layers
        # Read-out starts as the baseline (answer 1 whatever the input); training moves it.
        head = eqx.nn.Linear(hidden, "scalar", key=keys[-1])
        self.head = eqx.tree_at(lambda h: (h.weight, h.bias), head,
                                (jnp.zeros_like(head.weight), jnp.ones_like(head.bias)))

    def __call__(self, xs):  # xs: (T, 2)
        for layer in self.layers:
            xs = layer(xs)
        return self.head(xs[-1])


def clip_recurrent_weights(model: AddingModel) -> AddingModel:
    """Keep |weight_hh| <= 1 so that no unit's state can grow exponentially."""
    return eqx.tree_at(lambda m: [layer.weight_hh for layer in m.layers], model,
                       [jnp.clip(layer.weight_hh, -1.0, 1.0) for layer in model.layers])


def mean_squared_error(model, inputs, targets):
    return jnp.mean((jax.vmap(model)(inputs) - targets) ** 2)


def main():
    def extra(parser):
        parser.add_argument("--length", type=int, default=None, help="sequence length T")
        parser.add_argument("--epochs", type=int, default=None, help="number of epochs")

    args = parse_args(__doc__, extra)
    quick = dict(length=50, hidden=32, batch=64, epochs=10, steps=100, learning_rate=3e-3)
    full = dict(length=200, hidden=128, batch=64, epochs=20, steps=200, learning_rate=1e-3)
    setup = quick if args.quick else full
    setup.update({k: v for k, v in (("length", args.length), ("epochs", args.epochs))
                  if v is not None})
    length, steps, epochs = setup["length"], setup["steps"], setup["epochs"]

    key, model_key, test_key = jax.random.split(jax.random.key(0), 3)
    model = AddingModel(setup["hidden"], 2, length, key=model_key)
    init, update = adam(setup["learning_rate"])
    parameters, static = eqx.partition(model, eqx.is_array)
    state = init(parameters)
    test_inputs, test_targets = adding_problem(test_key, 1000, length)

    @eqx.filter_jit
    def train_step(parameters, state, key):
        inputs, targets = adding_problem(key, setup["batch"], length)
        loss, gradients = jax.value_and_grad(
            lambda p: mean_squared_error(eqx.combine(p, static), inputs, targets))(parameters)
        parameters, state = update(gradients, state, parameters)
        parameters = eqx.partition(clip_recurrent_weights(eqx.combine(parameters, static)),
                                   eqx.is_array)[0]
        return parameters, state, loss

    evaluate = eqx.filter_jit(lambda p: mean_squared_error(eqx.combine(p, static), test_inputs,
                                                           test_targets))

    print(f"adding problem, T = {length}: {setup['hidden']} units x 2 IndRNN layers, batch "
          f"{setup['batch']}, {steps} steps per epoch; baseline MSE {BASELINE:.3f}")
    test_mse = [float(evaluate(parameters))]
    print(f"epoch  0                      test MSE {test_mse[0]:.4f}", flush=True)
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        losses = []
        for _ in range(steps):
            key, step_key = jax.random.split(key)
            parameters, state, loss = train_step(parameters, state, step_key)
            losses.append(loss)
        test_mse.append(float(evaluate(parameters)))
        print(f"epoch {epoch:2d}  train MSE {float(jnp.mean(jnp.stack(losses))):.4f}  "
              f"test MSE {test_mse[-1]:.4f}  ({test_mse[-1] / BASELINE:.0%} of baseline, "
              f"{time.perf_counter() - start:.0f} s)", flush=True)

    best = min(test_mse)
    print(f"test MSE {test_mse[0]:.4f} -> {test_mse[-1]:.4f} (best {best:.4f}); baseline "
          f"{BASELINE:.3f}")
    assert test_mse[-1] < 0.5 * BASELINE, "the model did not beat the baseline"

    def draw(figure):
        panel = figure.subplots()
        panel.semilogy(range(epochs + 1), test_mse, "o-", label="IndRNN, held-out MSE")
        panel.axhline(BASELINE, color="k", ls=":", label="always answer 1 (1/6)")
        panel.set(xlabel="epoch", ylabel="mean squared error",
                  title=f"adding problem, T = {length}")
        panel.legend()

    save_figure(args.out, "indrnn_adding.png", draw, size=(5.5, 3.6))


if __name__ == "__main__":
    main()
