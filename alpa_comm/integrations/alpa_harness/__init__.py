"""Running Alpa 0.2.3's own code here (issue: the adapter checked against Alpa's real
classes, not fixtures). Alpa's wheel is pure Python; what it needs from jax 0.3.22's C++
extension (``pmap_lib``'s sharding types, XLA's ``OpSharding``) is stood in for by
``pxla_compat``, which the tests check against jax 0.3.22's own ``pxla.py``."""
