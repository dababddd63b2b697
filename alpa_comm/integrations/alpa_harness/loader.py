"""Import Alpa 0.2.3's own modules in this process, with stand-ins only for what needs
jax 0.3.22's C++ extension, XLA, GPUs or Ray.

* ``jax.interpreters.pxla`` is ``pxla_compat`` (checked against jax 0.3.22's own code);
* every other ``jax``/``jaxlib``/``flax``/``ray``/``cupy``/... module, and Alpa's modules
  that only wrap XLA compilation or NCCL (``STUBBED_ALPA``), are *catch-all stubs*: any
  attribute is a permissive class, so module-level code that names them (decorators,
  base classes, constants) runs, and anything that would really need them fails loudly
  when called in a way a stub cannot answer;
* the ``alpa`` package is Alpa's folder from the wheel, without running its
  ``__init__`` (which starts importing everything); Alpa's other modules are its own
  files, unchanged.

This replaces process-wide modules (``jax``), so it runs in a process of its own
(``run_in_subprocess``). Importing ``alpa.global_env`` appends GPU-only ``XLA_FLAGS``
to the environment; the loader puts the variable back.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

from ...errors import UsageError
from . import pxla_compat, ray_compat

STUBBED_TOP = ("jax", "jaxlib", "flax", "ray", "cupy", "optax", "chex", "numba", "pulp", "torch")
STUBBED_ALPA = ("alpa.collective", "alpa.shard_parallel", "alpa.mesh_profiling", "alpa.monkey_patch",
                "alpa.serve", "alpa.torch", "alpa.model")
"""Alpa modules that only drive XLA passes, NCCL or other frameworks."""
REAL_IN_STUBS = ("alpa.collective.worker_nccl_util", "alpa.collective.worker_nccl_util_cupy")
"""Alpa's own files inside a stubbed package: the worker-side NCCL glue, so its broadcast
runs here with NumPy stand-ins for CuPy and NCCL put in its namespace by a test."""
ALPA_NCCL_COLLECTIVE = ("alpa.collective.types", "alpa.collective.const",
                        "alpa.collective.collective_group.nccl_util",
                        "alpa.collective.collective_group.base_collective_group",
                        "alpa.collective.collective_group.cuda_stream",
                        "alpa.collective.collective_group.nccl_collective_group")
"""Alpa's own NCCL collective group (``NCCLGroup``: communicators per device made in one
group, a stream pool per GPU, events between streams), real only where a test asks
(``real_files``) with a CuPy stand-in installed first (``alpa_comm.testing.nccl_model``)."""
_REAL: set[str] = set(REAL_IN_STUBS)
PXLA = "jax.interpreters.pxla"
PRELUDE = ("alpa.global_env", "alpa.device_mesh")
"""Imported first, as Alpa's package import reaches them first: ``device_mesh`` and
``util`` import each other, which only works with ``device_mesh`` started first."""


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __setitem__(cls, key, value):
        pass  # registries (``core.pytype_aval_mappings[X] = ...``) keep nothing

    def __contains__(cls, item):
        return False

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0


class Stub(metaclass=_StubMeta):
    """Stands for anything of a framework the harness does not run."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{type(self).__qualname__}.{name}")()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: keep what it decorates
        return type(self)()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __getitem__(self, item):
        return type(self)()

    def __setitem__(self, key, value):
        pass

    def __contains__(self, item):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_CLASSES: dict[str, type] = {}


def stub_class(name: str) -> type:
    cls = _CLASSES.get(name)
    if cls is None:
        cls = _CLASSES[name] = _StubMeta(name.rsplit(".", 1)[-1], (Stub,), {"__qualname__": name})
    return cls


def _stub_module(name: str) -> types.ModuleType:
    module = (ray_compat.RayUtilModule if name == "ray.util" else types.ModuleType)(name)
    module.__path__ = []  # a package: submodules are stubs too
    ray_compat.populate(module)  # the Ray driver calls alpa.init makes answer for a pretend cluster

    def __getattr__(attr, _name=name):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        full = f"{_name}.{attr}"
        if full == PXLA:
            return importlib.import_module(PXLA)
        return stub_class(full)

    module.__getattr__ = __getattr__
    return module


def _pxla_module() -> types.ModuleType:
    module = types.ModuleType(PXLA)
    for k in dir(pxla_compat):
        if not k.startswith("__"):
            setattr(module, k, getattr(pxla_compat, k))
    module.__getattr__ = lambda attr: stub_class(f"{PXLA}.{attr}")
    return module


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, alpa_dir: Path):
        self.alpa_dir = alpa_dir

    def find_spec(self, name, path=None, target=None):
        if name in _REAL:
            return importlib.util.spec_from_file_location(
                name, self.alpa_dir.parent / (name.replace(".", "/") + ".py"))
        top = name.split(".")[0]
        stubbed = top in STUBBED_TOP or any(name == m or name.startswith(m + ".") for m in STUBBED_ALPA)
        if name == "alpa" or stubbed:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name == PXLA:
            return _pxla_module()
        if spec.name == "alpa":
            module = types.ModuleType("alpa")
            module.__path__ = [str(self.alpa_dir)]  # Alpa's folder; its __init__ is not run
            return module
        return _stub_module(spec.name)

    def exec_module(self, module):
        pass


def real_files(names) -> dict[str, types.ModuleType]:
    """Alpa's own files for these modules, imported in the given order (dependencies
    first), inside stubbed packages too (``ALPA_NCCL_COLLECTIVE``): each becomes its
    package's attribute, so ``from package import name`` in Alpa's files finds it and not
    a stub. Their other imports resolve as usual (a ``cupy`` already in ``sys.modules``,
    such as the NCCL model's, is used as it is)."""
    _REAL.update(names)
    out = {}
    for name in names:
        sys.modules.pop(name, None)  # a stub made before, if any
        out[name] = importlib.import_module(name)
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, out[name])
    return out


def install(alpa_root: Path) -> None:
    """Make ``import alpa...`` load Alpa 0.2.3 from ``alpa_root`` (the wheel's contents)."""
    clash = [m for m in ("jax", "alpa") if m in sys.modules]
    if clash:
        raise UsageError(f"the Alpa harness needs a fresh process: {clash} already imported")
    sys.meta_path.insert(0, _Finder(Path(alpa_root) / "alpa"))


def load(alpa_root: Path, modules: tuple[str, ...]) -> dict[str, types.ModuleType]:
    """Alpa's own ``modules``, imported (the environment left as it was)."""
    install(alpa_root)
    env = dict(os.environ)
    try:
        for m in PRELUDE:
            importlib.import_module(m)
        return {m: importlib.import_module(m) for m in modules}
    finally:
        os.environ.clear()
        os.environ.update(env)


def load_package(alpa_root: Path, num_hosts: int = 4, gpus_per_host: int = 4) -> types.ModuleType:
    """Alpa's whole package, its own ``__init__`` run (``alpa.init``, ``alpa.__version__``,
    ``PipeshardParallel``, ...), with the pretend Ray cluster ``num_hosts`` x
    ``gpus_per_host`` for ``alpa.init(cluster="ray")``."""
    load(alpa_root, ())
    ray_compat.set_cluster(num_hosts, gpus_per_host)
    alpa = sys.modules["alpa"]
    init = Path(alpa.__path__[0]) / "__init__.py"
    env = dict(os.environ)
    try:
        exec(compile(init.read_text(), str(init), "exec"), alpa.__dict__)  # noqa: S102 - Alpa's own file
    finally:
        os.environ.clear()
        os.environ.update(env)
    return alpa


def run_in_subprocess(code: str, stdin: str | None = None, timeout: float = 300,
                      stream_stderr: bool = False) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with this package importable (``stdin`` fed to
    it); it may call ``load(ALPA_ROOT, ...)`` or ``load_package(ALPA_ROOT)`` (``ALPA_ROOT``
    is defined for it). ``stream_stderr``: its progress lines go to this process's stderr
    as they come (the result's ``stderr`` is then empty)."""
    from .sources import alpa_root  # noqa: PLC0415

    root = alpa_root()
    prelude = (f"from alpa_comm.integrations.alpa_harness.loader import load, load_package\n"
               f"ALPA_ROOT = {str(root)!r}\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    return subprocess.run([sys.executable, "-c", prelude + code], input=stdin, stdout=subprocess.PIPE,
                          stderr=None if stream_stderr else subprocess.PIPE, text=True, timeout=timeout, env=env)
