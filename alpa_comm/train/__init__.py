"""Pipeline training on JAX (needs jax): the schedule IR executed for real.

``split_vjp`` (``alpa_comm.train.split_vjp``) splits any function's backward into its
input- and weight-gradient halves; it is loaded on first use, so that importing the
package's plain-data modules (``stage_setup``) does not import JAX.
"""


def __getattr__(name):
    if name == "split_vjp":
        from .backward_split import split_vjp
        return split_vjp
    raise AttributeError(f"module 'alpa_comm.train' has no attribute {name!r}")


__all__ = ["split_vjp"]
