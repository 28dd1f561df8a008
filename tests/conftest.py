import jax

# float64 and complex128 cases need x64; float32 cases pass explicit float32 arrays.
jax.config.update("jax_enable_x64", True)
