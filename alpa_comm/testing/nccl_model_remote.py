"""The NCCL model across processes: one model world (``nccl_model.NcclModel``) served by
one process, the fake CuPy of every other process a client of it, so code whose ranks are
processes (``alpa_comm.jax`` with ``backend="nccl"`` under ``jax.distributed``) runs on the
model unchanged.

* ``serve()`` (in the test's process) installs the model there and listens on a Unix
  socket; ``address``/``env()`` say how to reach it.
* ``connect(address, authkey)`` (in each rank's process, or ``connect_from_env()``) puts a
  ``cupy`` in ``sys.modules`` whose arrays are local (``ModelArray``: NumPy memory, as in
  the model) and whose streams, events, devices, communicators and group calls live in the
  server: every call is forwarded, one connection per calling thread, so the server runs
  it on a thread of its own that stands for the caller (the model's rules, its deadlock
  report and its error types hold as in one process).
* Bytes move when the model says an operation runs: the server reads the sender's memory
  and writes the receiver's through a memory connection each client serves (``read``,
  ``write`` of addresses in that process), so a buffer written on a stream after the send
  was issued is read as NCCL would read it: when the send runs.

Only for tests: nothing here is fast, and the socket is the machine's own.
"""
from __future__ import annotations

import ctypes
import os
import secrets
import sys
import tempfile
import threading
from contextlib import contextmanager
from multiprocessing.connection import Client, Listener

from ..errors import CommunicationError
from . import nccl_model as M

ENV = "ALPA_COMM_NCCL_MODEL"
"""``ADDRESS,AUTHKEY_HEX``: where ranks started by a test find the served model."""
_ERRORS = {e.__name__: e for e in (M.NcclDeadlock, M.NcclMismatch, AttributeError, TypeError, ValueError, KeyError,
                                    IndexError)}
"""Errors raised again in the client as what they were (others as ``RuntimeError``)."""


# ------------------------------------------------------------------- server
class _ClientMemory:
    """A client process's memory, read and written through the connection it serves."""

    def __init__(self, conn):
        self.conn, self.lock = conn, threading.Lock()

    def _ask(self, msg):
        with self.lock:
            try:
                self.conn.send(msg)
                reply = self.conn.recv()
            except (EOFError, OSError) as e:
                raise CommunicationError(f"NCCL model: a rank's process is gone ({e})") from None
        if isinstance(reply, Exception):
            raise reply
        return reply

    def read(self, ptr: int, nbytes: int) -> bytes:
        return self._ask(("read", ptr, nbytes))

    def write(self, ptr: int, data: bytes) -> None:
        self._ask(("write", ptr, data))


class ModelServer:
    """The served model: ``address``, ``authkey``, ``env()``; ``model`` is the world."""

    def __init__(self, model: M.NcclModel):
        self.model = model
        self._dir = tempfile.mkdtemp(prefix="nccl-model-")
        self.address = os.path.join(self._dir, "socket")
        self.authkey = secrets.token_bytes(16)
        self._listener = Listener(self.address, "AF_UNIX", authkey=self.authkey)
        self._objects: dict[int, object] = {}
        self._memories: dict[int, _ClientMemory] = {}
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="nccl-model-accept", daemon=True).start()

    def env(self) -> dict[str, str]:
        return {ENV: f"{self.address},{self.authkey.hex()}"}

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for name in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, name))
        os.rmdir(self._dir)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
                kind, pid, thread = conn.recv()
            except Exception:  # noqa: BLE001 - a stranger (wrong key, no hello) must not stop the others
                if self._closed:
                    return
                continue
            if kind == "memory":
                self._memories[pid] = _ClientMemory(conn)
                conn.send("ok")
            else:
                threading.Thread(target=self._serve, args=(conn, pid), name=f"process {pid} thread {thread}",
                                 daemon=True).start()

    # objects the clients hold by reference
    def _ref(self, value):
        if isinstance(value, (M.Stream, M.Event, M.Device, M.NcclCommunicator)):
            with self._lock:
                self._objects[id(value)] = value
            return ("ref", id(value), type(value).__name__)
        return value

    def _deref(self, value):
        if isinstance(value, tuple) and len(value) == 3 and value[0] == "ref":
            return self._objects[value[1]]
        if isinstance(value, (list, tuple)):
            return type(value)(self._deref(v) for v in value)
        return value

    def _serve(self, conn, pid: int) -> None:
        """One client thread's calls, on this thread (which the model takes for it)."""
        M._TLS.space = self._memories.get(pid)
        if M._TLS.space is None:  # its addresses are not ours: refuse rather than write to them here
            conn.send(("err", "RuntimeError", f"process {pid} has no memory connection to the NCCL model"))
            conn.close()
            return
        functions = {"get_unique_id": lambda: M._ACTIVE.new_uid(), "groupStart": lambda: M._ACTIVE.group_start(),
                     "groupEnd": lambda: M._ACTIVE.group_end(), "get_current_stream": M.get_current_stream,
                     "null_stream": lambda: M.Stream.null}
        classes = {"Stream": M.Stream, "Event": M.Event, "Device": M.Device, "NcclCommunicator": M.NcclCommunicator}
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the client thread ended: the model sees this thread end with it
            try:
                M._TLS.where, msg = msg[0], msg[1:]  # where the client issued it, for the reports
                what, args = msg[0], self._deref(msg[1:])
                if what == "new":
                    result = classes[args[0]](*args[1], **args[2])
                elif what == "func":
                    result = functions[args[0]](*args[1], **args[2])
                elif what == "getattr":
                    value = getattr(args[0], args[1])
                    result = ("method",) if callable(value) else value
                else:  # call
                    result = getattr(args[0], args[1])(*args[2], **args[3])
                reply = ("ok", self._ref(result))
            except BaseException as e:  # noqa: BLE001 - raised again in the client
                reply = ("err", type(e).__name__, str(e))
            try:
                conn.send(reply)
            except (EOFError, OSError):
                return


@contextmanager
def serve(**model):
    """Install the model in this process and serve it to others; yields the server."""
    with M.install(**model) as world:
        server = ModelServer(world)
        try:
            yield server
        finally:
            server.close()


# ------------------------------------------------------------------- client
class _Link:
    """This process's way to the server: a connection per thread (closed with the thread)."""

    def __init__(self, address: str, authkey: bytes):
        self.address, self.authkey = address, authkey
        self._local = threading.local()
        memory = Client(address, "AF_UNIX", authkey=authkey)
        memory.send(("memory", os.getpid(), "memory"))
        memory.recv()
        threading.Thread(target=self._serve_memory, args=(memory,), name="nccl-model-memory", daemon=True).start()

    @staticmethod
    def _serve_memory(conn) -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            try:
                if msg[0] == "read":
                    reply = ctypes.string_at(msg[1], msg[2])
                else:
                    ctypes.memmove(msg[1], msg[2], len(msg[2]))
                    reply = None
            except Exception as e:  # noqa: BLE001 - handed to the server
                reply = e
            conn.send(reply)

    def call(self, *msg):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = Client(self.address, "AF_UNIX", authkey=self.authkey)
            conn.send(("api", os.getpid(), threading.current_thread().name))
        conn.send((M.where_issued(skip=(__file__,)),) + tuple(_plain(m) for m in msg))
        reply = conn.recv()
        if reply[0] == "err":
            raise _ERRORS.get(reply[1], RuntimeError)(reply[2] if reply[1] in _ERRORS else f"{reply[1]}: {reply[2]}")
        return _stub(self, reply[1])


def _plain(value):
    if isinstance(value, _Remote):
        return value._ref
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


class _Remote:
    """An object of the server's (stream, event, device, communicator): attributes are
    read and methods called there."""

    def __init__(self, link: _Link, ref: tuple):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_ref", ref)

    def __getattr__(self, name: str):
        got = self._link.call("getattr", self._ref, name)
        if got == ("method",):
            return lambda *a, **kw: self._link.call("call", self._ref, name, a, kw)
        return got

    def __enter__(self):
        self._link.call("call", self._ref, "__enter__", (), {})
        return self

    def __exit__(self, *exc):
        return self._link.call("call", self._ref, "__exit__", (None, None, None), {})


class _RemoteDevice(_Remote):
    """A device: the current one is also kept here, where arrays are made."""

    def use(self):
        M._TLS.device = self.id
        return self._link.call("call", self._ref, "use", (), {})

    def __enter__(self):
        self._prev = M._current_device()
        M._TLS.device = self.id
        return super().__enter__()

    def __exit__(self, *exc):
        M._TLS.device = self._prev
        return super().__exit__(*exc)


def _stub(link: _Link, value):
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "ref":
        return (_RemoteDevice if value[2] == "Device" else _Remote)(link, value)
    return value


def _class(link: _Link, name: str, extra: dict | None = None):
    """A stand-in for the server's class ``name``: calling it makes one there."""
    return type(name, (), {"__new__": lambda cls, *a, **kw: link.call("new", name, a, kw), **(extra or {})})


def connect(address: str, authkey: bytes) -> None:
    """Make this process a client of the served model: ``cupy`` (``cupy.cuda``,
    ``cupy.cuda.nccl``) in ``sys.modules`` for the rest of the process."""
    link = _Link(address, authkey)
    nccl = M._nccl_module()
    nccl.NcclCommunicator = _class(link, "NcclCommunicator")
    for name in ("get_unique_id", "groupStart", "groupEnd"):
        setattr(nccl, name, lambda *a, _n=name, **kw: link.call("func", _n, a, kw))
    cp = M._cupy_module(nccl)
    cp.cuda.Stream = _class(link, "Stream")
    cp.cuda.Stream.null = link.call("func", "null_stream", (), {})
    cp.cuda.Event = _class(link, "Event")
    cp.cuda.Device = _class(link, "Device")
    cp.cuda.get_current_stream = lambda: link.call("func", "get_current_stream", (), {})
    cp.cuda.nccl = nccl
    sys.modules.update({"cupy": cp, "cupy.cuda": cp.cuda, "cupy.cuda.nccl": nccl})


def connect_from_env() -> bool:
    """``connect`` to the model named by ``ALPA_COMM_NCCL_MODEL``, if set; whether it was."""
    value = os.environ.get(ENV)
    if not value:
        return False
    address, _, key = value.rpartition(",")
    connect(address, bytes.fromhex(key))
    return True
