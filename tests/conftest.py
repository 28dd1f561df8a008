import jax
import pytest
from helpers import release_programs

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


# Each XLA:CPU executable keeps a few memory maps while a cache holds it; a worker that has
# compiled thousands of programs reaches the kernel's limit (vm.max_map_count, 65 530 here)
# and crashes inside XLA's compiler (SIGSEGV or SIGABRT in backend_compile_and_load). Past
# half the limit, the compiled programs are dropped (helpers.release_programs). Counted every
# MAPS_EVERY tests: reading /proc/self/maps costs a few milliseconds.
MAPS_EVERY = 25


def _maps_limit() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None  # not Linux: nothing to watch


MAPS_LIMIT = _maps_limit()
_tests_run = 0


@pytest.fixture(autouse=True)
def _release_programs_before_the_maps_run_out():
    yield
    global _tests_run
    _tests_run += 1
    if MAPS_LIMIT is None or _tests_run % MAPS_EVERY:
        return
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    if maps > MAPS_LIMIT // 2:
        release_programs()


# Whole modules outside the fast tier: they start subprocesses, build the docs site, run the
# examples, compile for a GPU or draw property-based cases.
SLOW_MODULES = frozenset({
    "test_benchmark_data", "test_docs_site", "test_examples", "test_gpu_aot", "test_gpu_compile",
    "test_gpu_model", "test_gpu_report", "test_multihost", "test_properties", "test_sharding",
    "test_tpu_compile",
})
# CI's tier runs these modules' every case: every entry point compiled for a TPU v5e and the
# newer generations, without a TPU.
EVERY_CASE_IN_CI = frozenset({"test_tpu_compile"})
# and leaves these to the whole suite: the GPU report's quick run on CPU, which repeats what the
# GPU compile and model tests check, in a form meant for a GPU.
OUTSIDE_CI = frozenset({"test_gpu_report"})


def pytest_collection_modifyitems(config, items):
    """Three tiers. The fast tier (`-m "not slow"`) runs every test function once, with its
    first parameters (once per module, class and name, so each backend's subclass of a
    family's contract keeps a case of every test), outside SLOW_MODULES. CI's tier
    (`-m "not exhaustive"`, the README's test command) adds the first case of every function
    in SLOW_MODULES and every case of EVERY_CASE_IN_CI. The whole suite (`-m "not large"`)
    runs every parameter; `large` marks the long property-based runs."""
    seen = set()
    for item in items:
        module = item.module.__name__
        function = (module, item.cls.__name__ if item.cls else None,
                    getattr(item, "originalname", item.name))
        first = function not in seen
        seen.add(function)
        large = item.get_closest_marker("large") is not None
        if module in SLOW_MODULES or not first or large:
            item.add_marker(pytest.mark.slow)
        if large or module in OUTSIDE_CI or not (first or module in EVERY_CASE_IN_CI):
            item.add_marker(pytest.mark.exhaustive)
