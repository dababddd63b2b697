"""Cross-mesh resharding of ``jax.Array``s in processes you own (multi-process JAX).

    import jax
    jax.distributed.initialize(...)                 # one process per host
    from alpa_comm.jax import reshard, reshard_tree
    y = reshard(x, NamedSharding(infer_mesh, P(None, "tp")))   # every process of both meshes calls it

See docs/jax.md."""
from .group import ProcessGroup, default_group
from .placement import JaxHosts, named_sharding, placement
from .reshard import reshard, reshard_tree

__all__ = ["JaxHosts", "ProcessGroup", "default_group", "named_sharding", "placement", "reshard", "reshard_tree"]
