"""Pipeline training on JAX (needs jax): the schedule IR executed for real."""
