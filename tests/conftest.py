import jax
import pytest

# float64 and complex128 cases need x64; float32 cases pass explicit float32 arrays.
jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _cpu_device_when_marked(request):
    """Tests marked `cpu_device` exercise CPU-only code (the native C++ kernels, CPU lowerings):
    on a machine whose default device is a GPU they run with the CPU as the default device, as a
    user calling those paths would place the arrays. On a CPU-only machine this changes nothing."""
    if request.node.get_closest_marker("cpu_device") is None:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield
