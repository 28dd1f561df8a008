"""jax 0.11's Mosaic GPU default on the jax at hand, for deviceless compiles (tests/support/gpu_aot.py
imports this module by name): jax 0.11 lowers a `plgpu.kernel` with warpgroup semantics
unless its CompilerParams say otherwise (jax 0.10: lane semantics). Importing this module makes
`plgpu.kernel` without compiler_params use warpgroup semantics here too, so a compile through
it shows what jax 0.11 would do with kernels that leave the choice to jax."""

from jax.experimental.pallas import mosaic_gpu as plgpu

from tridiax._recurrence.api import recurrence  # noqa: F401 - named by the cases' expressions
from tridiax._tridiagonal.api import solve  # noqa: F401

_kernel = plgpu.kernel


def _kernel_with_jax_011_default(*args, compiler_params=None, **kwargs):
    if compiler_params is None:
        compiler_params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    return _kernel(*args, compiler_params=compiler_params, **kwargs)


plgpu.kernel = _kernel_with_jax_011_default
