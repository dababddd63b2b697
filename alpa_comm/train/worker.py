"""``PipelineWorker``: a host worker that also runs one pipeline stage (one replica).
With virtual stages the stage's mesh runs several model stages (chunks): one
``StageRunner`` each, handing over locally where two of them meet on this mesh.

Inside the host the stage is one jitted SPMD program over the host's local JAX
devices (``--xla_force_host_platform_device_count`` CPU devices here, GPUs
elsewhere): parameters replicated, the microbatch split over the devices.
Edges arrive in the ``IN`` layout (replicated over the host's devices) and
leave in ``OUT`` (split) — see ``edges``. The worker executes its stage's
actions of the schedule without asking the driver (one call per training
step), moves activations and gradients through a mailbox (``transport.make_mailbox``), averages
gradients over the stage's data-parallel hosts in flat buckets and applies an
optax optimizer.

JAX is imported only inside methods: the flag that sets the number of local
devices must be in the environment before JAX starts in this process.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from .._extras import require
from ..errors import UsageError
from ..runtime.allreduce import allreduce_mean
from ..runtime.thread_cpu import difference, thread_cpu_seconds
from ..runtime.worker import HostWorker
from ..validation import one_of
from .stage_setup import StageSetup
from .transport import ALLREDUCE_TAG_BASE, make_mailbox


def xla_flags(devices_per_host: int, existing: str = "") -> str:
    """XLA flags for ``devices_per_host`` CPU devices, single-threaded compute per
    device (emulated hosts share the machine's cores)."""
    keep = [f for f in existing.split() if not f.startswith(("--xla_force_host_platform_device_count",
                                                             "--xla_cpu_multi_thread_eigen"))]
    return " ".join(keep + [f"--xla_force_host_platform_device_count={devices_per_host}",
                            "--xla_cpu_multi_thread_eigen=false"])


OPTIMIZERS = ("sgd", "adam")
"""The optax optimizers a stage steps with (``make_optimizer``)."""


def make_optimizer(name: str, lr: float):
    """``(optimizer, update)``: the optax transformation and one jitted step
    ``update(params, opt_state, grads) -> (params, opt_state)``; the one-process and
    the distributed trainer both step with it."""
    jax, optax = require("jax"), require("optax")  # optional: a missing one names its extra

    opt = {"sgd": optax.sgd, "adam": optax.adam}[one_of(name, OPTIMIZERS, "optimizer")](lr)

    def update(params, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return opt, jax.jit(update)


class PipelineWorker(HostWorker):
    def __init__(self, host: int, num_hosts: int, devices_per_host: int, ifname: str | None = None):
        os.environ["XLA_FLAGS"] = xla_flags(devices_per_host, os.environ.get("XLA_FLAGS", ""))
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        super().__init__(host, num_hosts, devices_per_host, ifname)
        self.mailbox = None
        self._built: dict = {}    # (model, kwargs, model stages) -> (model, {model stage: compiled programs})
        self._updates: dict = {}  # (optimizer, lr) -> (optax transformation, compiled update)
        self._writer = None  # this stage's checkpoint part (``checkpoint.PartWriter``), on replica 0

    # ---------------------------------------------------------------- set-up
    def setup_stage(self, cfg: StageSetup) -> dict:
        """Build this host's stage replica: model (rebuilt from its arguments, same
        weights as the driver's), one runner with its programs per model stage of the mesh
        (several with virtual stages), optimizer and mailbox."""
        jax = require("jax")  # a host's first use of jax: a missing one names its extra
        from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415

        from .local_pipeline import LocalHandoffs  # noqa: PLC0415
        from .stage_runner import StageRunner, consumers_of  # noqa: PLC0415

        if self.mailbox is not None:
            self.mailbox.close()
        self.cfg = cfg
        self.stage, self.replica, self.dp = cfg.stage, cfg.replica, cfg.dp
        k = self.devices_per_host
        self.devices = jax.local_devices()[:k]
        if len(self.devices) < k:
            raise UsageError(f"host {self.host}: JAX sees {len(jax.local_devices())} local devices, {k} needed")
        mesh = Mesh(np.array(self.devices), ("d",))
        self.split = NamedSharding(mesh, PartitionSpec("d"))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.model_stages = cfg.model_stages
        V = cfg.num_model_stages
        model = self._model(cfg)
        programs = {v: self._programs(cfg, model, v) for v in self.model_stages}
        self.stage_fns = {v: model.stages[v] for v in self.model_stages}  # for ``regime``
        self.schedule = cfg.schedule
        self.actions = self.schedule.stages[self.stage]
        self.params = {v: jax.device_put(model.params[v], self.replicated) for v in self.model_stages}
        key = (cfg.optimizer, cfg.lr)
        if key not in self._updates:  # compiled once per optimizer, across set-ups
            self._updates[key] = make_optimizer(*key)
        opt, self.update = self._updates[key]
        self.opt_state = {v: jax.device_put(opt.init(p), self.replicated) for v, p in self.params.items()}
        self.mailbox = make_mailbox(self.host, self.transport(cfg.transport), cfg.jobs, cfg.edge_index,
                                    cfg.edge_keys, k, self.schedule, self.stage, cfg.timeout, self._to_buffers,
                                    self._from_buffers, zeros=not cfg.moves_data)
        self.runners = {v: StageRunner(v, V, programs[v], model.consumes[v], consumers_of(model.consumes, v),
                                       self.mailbox, sync=True) for v in self.model_stages}
        self.handoffs = LocalHandoffs(model.consumes, self.schedule)
        t0 = time.time()
        for c, v in enumerate(self.model_stages):
            self._warm_up(v, c, cfg.input_shapes.get(v, {}), cfg.batch_shape)
        return {"host": self.host, "stage": self.stage, "model_stages": list(self.model_stages),
                "devices": [str(d) for d in self.devices], "compile_s": time.time() - t0}

    def _model(self, cfg: StageSetup):
        """The model with one model stage per chunk, built once per (model, arguments, stages)
        and kept across set-ups with its compiled programs."""
        from ..models import build_model  # noqa: PLC0415

        key = (cfg.model, json.dumps(cfg.model_kwargs, sort_keys=True), cfg.num_model_stages)
        if key not in self._built:
            self._built[key] = (build_model(cfg.model, cfg.num_model_stages, **cfg.model_kwargs), {})
        return self._built[key][0]

    def _programs(self, cfg: StageSetup, model, v: int):
        """Model stage ``v``'s programs, compiled once per model and model stage and kept
        across set-ups, so trying several schedules or strategies on one cluster costs no
        recompilation."""
        import jax  # noqa: PLC0415

        from .stage_runner import StagePrograms  # noqa: PLC0415

        cache = self._built[(cfg.model, json.dumps(cfg.model_kwargs, sort_keys=True), cfg.num_model_stages)][1]
        if v not in cache:
            split = self.split

            def pin(tree):
                return jax.tree_util.tree_map(
                    lambda x: jax.lax.with_sharding_constraint(x, split) if x.ndim >= 1 else x, tree)

            cache[v] = StagePrograms(model.stages[v], pin)
        return cache[v]

    def _warm_up(self, v: int, chunk: int, input_shapes: dict, batch_shape: tuple) -> None:
        """Compile every program the schedule uses on model stage ``v`` (chunk ``chunk`` of
        this stage), on zeros, before the first step: all hosts compile at once here,
        instead of one after another along the pipeline while their peers' receives wait
        (and time out on slow hosts). Inputs from another mesh arrive replicated over the
        host's devices, those handed over on this mesh split as their producer left them:
        each compiled in the layout the step will give it."""
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415

        kinds = {a.kind for a in self.actions if a.chunk == chunk}
        p = self.runners[v].p
        local = set(self.handoffs.producers[v])
        src = self.runners[v].consumes
        batch = {k: jax.device_put(np.zeros(batch_shape, np.int32), self.split) for k in ("tokens", "targets")}
        inputs = {k: jax.device_put(np.zeros(shape, np.float32), self.split if src[k] in local else self.replicated)
                  for k, shape in input_shapes.items()}
        params = self.params[v]
        out, state = p.forward(params, inputs, batch)
        ct = {k: jnp.zeros_like(x) for k, x in out.items()}
        grads = None
        if "B" in kinds:
            grads, _ = p.backward(state, ct)
        if "BI" in kinds:
            _, wstate = p.backward_input(state, ct)
            grads = p.backward_weight(wstate)
        if grads is not None:
            jax.block_until_ready(p.accumulate(grads, grads))
            jax.block_until_ready(self.update(params, self.opt_state[v], grads))

    def _to_buffers(self, array) -> dict[int, np.ndarray]:
        """A stage output (split over local devices) as per-device buffers, global device ids."""
        base = self.host * self.devices_per_host
        return {base + self.devices.index(s.device): np.asarray(s.data) for s in array.addressable_shards}

    def _from_buffers(self, edge: str, key: str, bufs: dict[int, np.ndarray]):
        """Arrived per-device buffers as one local JAX array: replicated for activations,
        split for gradients."""
        import jax  # noqa: PLC0415

        base = self.host * self.devices_per_host
        devs = sorted(bufs)
        first = bufs[devs[0]]
        if edge.startswith("F"):
            sharding, shape = self.replicated, first.shape
        else:
            sharding, shape = self.split, (sum(bufs[d].shape[0] for d in devs),) + first.shape[1:]
        return jax.make_array_from_single_device_arrays(
            shape, sharding, [jax.device_put(bufs[d], self.devices[d - base]) for d in devs])

    # ---------------------------------------------------------------- training
    def train_step(self, microbatches: list[dict]) -> dict:
        """One step: every action of this stage in schedule order (each on its chunk's
        runner, local hand-offs between the mesh's model stages as in ``local_pipeline``),
        then the data-parallel gradient mean and the optimizer update, per model stage."""
        import jax  # noqa: PLC0415

        threads0 = thread_cpu_seconds()  # by thread: compute (XLA), runner, mailbox, the transport's I/O
        cpu0 = time.process_time()  # every thread of this host: compute, transport, runtime
        mbs = [{k: jax.device_put(np.asarray(v), self.split) for k, v in mb.items()} for mb in microbatches]
        for v, r in self.runners.items():
            r.begin(self.params[v], mbs)
        self.mailbox.events = []
        sched, stage = self.schedule, self.stage
        peak = [0, 0]
        try:
            for a in self.actions:
                if a.kind.is_recv:
                    self.mailbox.post(a.kind[-1], sched.peer_virtual_stage(stage, a),
                                      sched.virtual_stage(stage, a.chunk), a.mb)
            for a in self.actions:
                r = self.runners[sched.virtual_stage(stage, a.chunk)]
                if a.kind.is_comm:
                    r.run(a, sched.peer_virtual_stage(stage, a), block=True)
                    continue
                self.handoffs.before(stage, a, self.runners)
                r.run(a, -1)
                live = [x.live for x in self.runners.values()]
                peak = [max(peak[0], sum(n for n, _ in live)), max(peak[1], sum(b for _, b in live))]
        except BaseException:
            self.mailbox.abandon()  # the next step must not meet this one's transfers
            raise
        self.mailbox.flush()
        records = {v: r.finish() for v, r in self.runners.items()}
        t0 = time.time()
        self._update({v: r.grads for v, r in self.runners.items()})
        # each event labelled with its model stage, so traces and measurements keep a stage's chunks apart
        events = sorted((e + (v,) for v, rec in records.items() for e in rec.events), key=lambda e: e[2])
        events.append(("UPDATE", -1, t0, time.time(), stage))
        last = records.get(self.cfg.num_model_stages - 1)
        if len(records) == 1:  # one model stage: its own peak (the same count, kept as it was)
            (rec,) = records.values()
            peak = [rec.peak_live, rec.peak_live_bytes]
        state_bytes: dict[str, int] = {}
        for rec in records.values():  # one microbatch's live bytes over every chunk of the mesh
            for phase, n in rec.state_bytes.items():
                state_bytes[phase] = state_bytes.get(phase, 0) + n
        return {"host": self.host, "stage": self.stage, "replica": self.replica,
                "losses": last.losses if last is not None else {}, "events": events,
                "transfers": list(self.mailbox.events), "peak_live": peak[0], "peak_live_bytes": peak[1],
                "state_bytes": state_bytes, "cpu_seconds": time.process_time() - cpu0,
                "cpu_by_thread": difference(thread_cpu_seconds(), threads0),
                "checkpoint_writer": self._writer is not None,
                "checkpoint_done": self._writer.finished() if self._writer is not None else None}

    def _update(self, grads: dict) -> None:
        """Average ``grads`` (model stage -> tree) over the stage's data-parallel hosts in one
        all-reduce (every chunk's leaves in one list: one tag range, one round), then step
        each model stage's optimizer."""
        import jax  # noqa: PLC0415

        if self.dp > 1:
            leaves, tree = jax.tree_util.tree_flatten([grads[v] for v in self.model_stages])
            local = [np.asarray(x.addressable_shards[0].data) for x in leaves]
            hosts = list(range(self.stage * self.dp, self.stage * self.dp + self.dp))
            mean = allreduce_mean(self.backend, local, hosts, ALLREDUCE_TAG_BASE, timeout=self.cfg.timeout)
            averaged = jax.device_put(jax.tree_util.tree_unflatten(tree, mean), self.replicated)
            grads = dict(zip(self.model_stages, averaged))
        for v in self.model_stages:
            self.params[v], self.opt_state[v] = self.update(self.params[v], self.opt_state[v], grads[v])
        jax.block_until_ready(self.params)

    # ---------------------------------------------------------------- checkpoints (``checkpoint``)
    def checkpoint_open(self, directory: str, step: int | None, writer: bool) -> None:
        """Restore this stage's parameters and optimizer state from ``directory`` at ``step``
        (None: a fresh run), into the shardings set-up gave them; a writer (replica 0) then
        opens its part for saving."""
        from pathlib import Path  # noqa: PLC0415

        from . import checkpoint  # noqa: PLC0415

        root = Path(directory) / checkpoint.stage_part(self.stage)
        if step is not None:
            got = checkpoint.restore_part(root, step, checkpoint.state_tree(self.params, self.opt_state))
            self.params = {v: got["params"][str(v)] for v in self.model_stages}
            self.opt_state = {v: got["opt_state"][str(v)] for v in self.model_stages}
        if self._writer is not None:
            self._writer.close()
        self._writer = checkpoint.PartWriter(root) if writer else None

    def checkpoint_save(self, step: int, keep: list[int]) -> int | None:
        """Start saving this stage's state as ``step`` (``PartWriter.save``: returns at once)."""
        from . import checkpoint  # noqa: PLC0415

        return self._writer.save(step, checkpoint.state_tree(self.params, self.opt_state), keep)

    def checkpoint_wait(self) -> int | None:
        return self._writer.wait()

    def checkpoint_prune(self, keep: list[int]) -> None:
        self._writer.prune(keep)

    def regime(self, min_seconds: float = 0.5) -> dict:
        """What the stage's compute is made of, for reading a benchmark's regime:
        XLA's flop count of one microbatch's forward on this replica (over every model
        stage of the mesh), and this host's matmul rate — a (tokens x d) @ (d x 4d)
        product split over the host's devices as the stage programs are, timed here for
        ``min_seconds``, so under the same CPU cap."""
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415

        cfg = self.cfg
        batch = {k: jax.ShapeDtypeStruct(cfg.batch_shape, jnp.int32) for k in ("tokens", "targets")}
        flops = 0.0
        for v in self.model_stages:
            abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.params[v])
            inputs = {k: jax.ShapeDtypeStruct(shape, jnp.float32) for k, shape in cfg.input_shapes.get(v, {}).items()}
            cost = jax.jit(self.stage_fns[v]).lower(abstract, inputs, batch).compile().cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            flops += float(cost.get("flops", 0.0))
        tokens = int(np.prod(cfg.batch_shape))
        d = int(cfg.model_kwargs.get("d", 64))
        a = jax.device_put(np.ones((tokens, d), np.float32), self.split)
        w = jax.device_put(np.ones((d, 4 * d), np.float32), self.replicated)
        matmul = jax.jit(jnp.matmul)
        jax.block_until_ready(matmul(a, w))
        # sustained, not one product: the cap is a quota per short period, so a product
        # shorter than the period may run at the full core's speed
        calls, t0 = 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - t0 < min_seconds:
            jax.block_until_ready(matmul(a, w))
            calls += 1
        rate = calls * 2.0 * tokens * d * 4 * d / (time.perf_counter() - t0)
        return {"host": self.host, "stage": self.stage, "forward_flops": flops, "matmul_flops_per_s": rate}

    def stage_params(self) -> dict:
        """This replica's parameters as NumPy, by model stage (one entry per chunk of the
        mesh; one without virtual stages), for checks against a reference."""
        import jax  # noqa: PLC0415

        return {v: jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_shards[0].data), p)
                for v, p in self.params.items()}

    def time_edge(self, edge: str | None, repeats: int, timeout: float) -> list[tuple[float, float, float, dict]]:
        """Run ``edge``'s plans alone ``repeats`` times (zeros as data); every host of
        the gloo group calls this together, so hosts off the edge (or given None: outside
        the pipeline being timed) only take the barrier. Per run: start, end and the CPU
        seconds this host's process spent meanwhile (every thread: the transport's cost),
        and the same by thread name (``runtime.thread_cpu``: gloo's I/O thread apart).
        ``timeout``: the barrier's, from the driver (a host outside every pipeline set up so
        far has no stage configuration to read one from)."""
        out = []
        for r in range(repeats):
            self.backend.barrier(timeout)
            if self.mailbox is None or edge not in self.mailbox.jobs:
                continue
            srcs = self.mailbox.zero_sources(edge)
            threads0 = thread_cpu_seconds()  # read outside the timed span: the reads cost CPU too
            t0, cpu0 = time.time(), time.process_time()
            self.mailbox._run(edge, r % self.mailbox.M, srcs)
            t1, cpu = time.time(), time.process_time() - cpu0
            out.append((t0, t1, cpu, difference(thread_cpu_seconds(), threads0)))
        return out

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.mailbox is not None:
            self.mailbox.close()
        super().close()
