"""A strict stand-in for cupy, so that kernels are checked against cupy's rules without a GPU.

``StrictCupy()`` is an array module whose arrays (``DeviceArray``) hold numpy data but
behave as cupy's do where cupy differs from numpy, and fail loudly where a kernel would
fail or stall on a GPU:

- names: only what cupy has (module functions, ``ndarray`` methods, ``cupy.random``);
- arguments: positional and keyword arguments are bound against cupy's own signatures
  (``inspect.signature`` of the cupy function, or the signature line of a Cython method's
  docstring); a ufunc takes only ``out``, ``dtype`` and ``casting``;
- ufunc methods as cupy implements them (cupy/_core/_kernel.pyx, ``ufunc``): ``reduce``
  and ``accumulate`` only for add and multiply, ``reduceat`` only for add, ``at`` only
  for ufuncs with a scatter kernel (add, maximum, minimum) and only for the dtypes of
  those kernels (cupy/_core/_routines_indexing.pyx, ``_scatter_op_single``);
- host memory: a numpy array handed to a device function (cupy raises TypeError), a
  numpy function called on a device array, and every implicit conversion to the host
  (``.item()``, ``float(x)``, ``int(x)``, ``bool(x)``, ``np.asarray(x)``, iteration,
  ``str``/``format``) raise ``CupyRuleError``;
- synchronisation: explicit host reads (``.get()``, ``.tolist()``, ``cupy.asnumpy``),
  boolean-mask indexing and the functions whose cupy docstring says they synchronise
  (``bincount``, ``nonzero``, one-argument ``where`` ...) are counted in ``ledger.syncs``;
- launches: every call that makes a new array on the device (a ufunc, a reduction, a
  gather, a copy, a fill, a host-to-device copy) counts one in ``ledger.launches``; calls
  whose result is a view of an input (reshape of a contiguous array, basic slicing,
  transpose) and ``empty`` count none. This is the launch count the cost model prices
  (``OpDef.launches``); it counts calls, not the exact kernels cupy runs inside each.

``__name__`` is "cupy", so kernels take their GPU branches.
"""
from __future__ import annotations

import ast
import inspect
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin


class CupyRuleError(AssertionError):
    """A kernel did something that fails, or stalls the device, under cupy."""


@dataclass
class Ledger:
    """What the kernels did since the last ``reset``."""

    launches: int = 0
    syncs: list[str] = field(default_factory=list)
    draws: list[str] = field(default_factory=list)   # dtypes of random draws
    largest: int = 0                                  # elements of the largest new array

    def reset(self) -> None:
        self.launches, self.syncs, self.draws, self.largest = 0, [], [], 0


# Functions that return no new device memory (metadata, allocation without a fill).
NO_LAUNCH = {"empty", "empty_like", "ndim", "shape", "size", "result_type", "can_cast", "dtype",
             "iinfo", "finfo", "isscalar", "promote_types", "broadcast_shapes", "get_array_module",
             "min_scalar_type", "issubdtype"}
# Functions that take host data and copy it to the device.
CREATION = {"asarray", "array", "asanyarray", "ascontiguousarray"}
# Scatter kernels behind ``ufunc.at`` and the dtypes cupy's atomics accept for each.
_SCATTER_DTYPES = {
    "add": {"int32", "float16", "float32", "float64", "uint32", "uint64"},
    "maximum": {"int32", "float32", "float64", "uint32", "uint64"},
    "minimum": {"int32", "float32", "float64", "uint32", "uint64"},
}
_FORBIDDEN_CONVERSION = "an implicit device-to-host conversion ({what}) would sync or fail under cupy"


def _cupy_functions_that_sync(cupy) -> set[str]:
    """Public cupy functions whose docstring warns that they synchronise the device."""
    return {n for n in dir(cupy) if not n.startswith("_") and callable(getattr(cupy, n))
            and "synchroniz" in (getattr(cupy, n).__doc__ or "")}


def signature_from_doc(func) -> inspect.Signature | None:
    """The signature on the first line of a Cython function's docstring
    (``_ndarray_base.astype(self, dtype, order='K', ...) -> ...``), defaults dropped."""
    line = (func.__doc__ or "").strip().split("\n", 1)[0]
    if "(" not in line:
        return None
    inner = line[line.index("(") + 1:line.rindex(")")]
    params = []
    for raw in _split_top_level(inner):
        raw = raw.strip().replace("\\*", "*")
        if not raw or raw == "/":
            params.append(raw)
            continue
        name, has_default = raw.split("=", 1)[0].strip(), "=" in raw
        name = name.split()[-1]           # drop a Cython type ("Py_ssize_t axis1")
        params.append(name + ("=None" if has_default and not name.startswith("*") else ""))
    source = f"def f({', '.join(p for p in params if p)}): pass"
    try:
        namespace: dict = {}
        exec(compile(ast.parse(source), "<signature>", "exec"), namespace)
    except SyntaxError:
        return None
    return inspect.signature(namespace["f"])


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def cupy_signature(func) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return signature_from_doc(func)


def check_call(where: str, sig: inspect.Signature | None, args: tuple, kwargs: dict) -> None:
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise CupyRuleError(f"{where}{sig}: {e} (cupy's signature differs from numpy's)") from None


# ------------------------------------------------------------------------ the arrays

class DeviceArray(NDArrayOperatorsMixin):
    """A numpy array standing for a cupy array; see the module docstring for its rules."""

    __slots__ = ("_a", "_xp")
    __array_priority__ = 1000

    def __init__(self, a: np.ndarray, xp: "StrictCupy"):
        self._a, self._xp = a, xp

    # -- metadata (no device work) --
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    device = property(lambda self: types.SimpleNamespace(id=0))
    T = property(lambda self: self.transpose())

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype})"

    # -- implicit host conversions: fail loudly --
    def _forbidden(self, what: str):
        raise CupyRuleError(_FORBIDDEN_CONVERSION.format(what=what))

    def __array__(self, *args, **kwargs):
        self._forbidden("numpy.asarray / numpy.array of a device array")

    def __bool__(self):
        self._forbidden("bool(x)")

    def __float__(self):
        self._forbidden("float(x)")

    def __int__(self):
        self._forbidden("int(x)")

    def __index__(self):
        self._forbidden("operator.index(x), e.g. range(x) or a slice bound")

    def __complex__(self):
        self._forbidden("complex(x)")

    def __iter__(self):
        self._forbidden("iteration over a device array")

    def __format__(self, spec):
        self._forbidden("format(x) / an f-string of a device array")

    def __str__(self):
        self._forbidden("str(x)")

    def item(self, *args):
        self._forbidden("x.item()")

    # -- explicit host reads: counted --
    def get(self, *args, **kwargs) -> np.ndarray:
        check_call("cupy.ndarray.get", self._xp.method_signature("get"), (self,) + args, kwargs)
        self._xp.ledger.syncs.append("get")
        return np.array(self._a, copy=True)

    def tolist(self) -> list:
        self._xp.ledger.syncs.append("tolist")
        return self._a.tolist()

    # -- numpy protocols --
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self._xp.ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        raise CupyRuleError(f"numpy.{func.__name__} called on a device array: call xp.{func.__name__}")

    # -- indexing --
    def __getitem__(self, key):
        key = self._xp.index_key(key)
        out = self._a[key]
        return self._xp.result(out, [self._a])

    def __setitem__(self, key, value):
        key = self._xp.index_key(key)
        data = self._xp.unwrap(value, "setitem")
        target = self._a[key]
        if _same_view(target, data):
            return   # ``y[s] += v`` writes the view back onto itself: cupy skips it
        self._a[key] = data
        self._xp.ledger.launches += 1

    # -- every other method: cupy's name and signature, numpy's work --
    def __getattr__(self, name: str):
        xp = self._xp
        if name.startswith("_") or not hasattr(xp.cupy.ndarray, name):
            raise AttributeError(f"cupy.ndarray has no attribute '{name}'")
        if not hasattr(self._a, name):
            raise CupyRuleError(f"cupy.ndarray.{name} is cupy-only; the stand-in cannot run it")
        method = getattr(self._a, name)

        def call(*args, **kwargs):
            check_call(f"cupy.ndarray.{name}", xp.method_signature(name), (self,) + args, kwargs)
            if name in ("nonzero", "compress"):
                xp.ledger.syncs.append(name)
            if name == "repeat" and args and isinstance(args[0], DeviceArray):
                xp.ledger.syncs.append("repeat with device repeats")
            out = method(*xp.unwrap(args, name), **xp.unwrap(kwargs, name))
            if name == "fill":
                xp.ledger.launches += 1
                return None
            return xp.result(out, [self._a])
        return call


# ------------------------------------------------------------------------ the module

class StrictCupy:
    """cupy's names and rules over numpy arrays; ``ledger`` counts launches and syncs."""

    __name__ = "cupy"

    def __init__(self):
        import cupy
        self.cupy = cupy
        self.ledger = Ledger()
        self.ndarray = DeviceArray
        self._syncing = _cupy_functions_that_sync(cupy)
        self._method_sigs: dict[str, Any] = {}
        self.random = RandomStandIn(self)

    # -- wrapping --
    def wrap(self, a) -> DeviceArray:
        return DeviceArray(np.asarray(a), self)

    def unwrap(self, obj, where: str, host_ok: bool = False):
        """Device arrays to their numpy data, recursively; a host array is an error
        unless ``host_ok`` (creation functions copy host data to the device)."""
        if isinstance(obj, DeviceArray):
            return obj._a
        if isinstance(obj, np.ndarray) and not host_ok:
            raise CupyRuleError(f"{where}: a numpy (host) array was passed to a device function; "
                                "cupy raises TypeError (move it with xp.asarray first)")
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.unwrap(o, where, host_ok) for o in obj)
        if isinstance(obj, dict):
            return {k: self.unwrap(v, where, host_ok) for k, v in obj.items()}
        return obj

    def result(self, out, inputs: list[np.ndarray], launches: int | None = None):
        """Wrap ``out`` (arrays, numpy scalars, tuples of them) as device arrays and count a
        launch unless every array of it is a view of an input."""
        if launches is None:
            launches = 0 if _all_views(out, inputs) else 1
        self.ledger.launches += launches
        if launches:
            sizes = [o.size for o in (out if isinstance(out, (tuple, list)) else (out,))
                     if isinstance(o, (np.ndarray, np.generic))]
            self.ledger.largest = max([self.ledger.largest] + sizes)
        return self._wrap_all(out)

    def _wrap_all(self, out):
        if isinstance(out, np.ndarray) or isinstance(out, np.generic):
            return self.wrap(out)
        if isinstance(out, tuple):
            return tuple(self._wrap_all(o) for o in out)
        if isinstance(out, list):
            return [self._wrap_all(o) for o in out]
        return out

    def index_key(self, key):
        """An index for a device array: device arrays unwrapped; a boolean mask syncs
        (cupy counts its true values on the host to size the result)."""
        parts = key if isinstance(key, tuple) else (key,)
        for p in parts:
            data = p._a if isinstance(p, DeviceArray) else p
            if isinstance(data, np.ndarray) and data.dtype == bool:
                self.ledger.syncs.append("boolean mask indexing")
            if isinstance(data, np.ndarray) and not isinstance(p, DeviceArray):
                self.ledger.launches += 1          # cupy copies a host index array over
        return self.unwrap(key, "indexing", host_ok=True)

    def method_signature(self, name: str):
        if name not in self._method_sigs:
            self._method_sigs[name] = cupy_signature(getattr(self.cupy.ndarray, name))
        return self._method_sigs[name]

    # -- ufuncs --
    def ufunc(self, ufunc, method: str, inputs: tuple, kwargs: dict):
        cp = getattr(self.cupy, ufunc.__name__, None)
        if not isinstance(cp, self.cupy.ufunc) and ufunc.__name__ != "matmul":
            raise CupyRuleError(f"cupy has no ufunc '{ufunc.__name__}'")
        name = ufunc.__name__
        if method == "__call__":
            extra = set(kwargs) - {"out", "dtype", "casting"}
            if extra and name != "matmul":
                raise CupyRuleError(f"cupy.{name} takes only out, dtype and casting as keywords, "
                                    f"not {sorted(extra)}")
        else:
            self._check_ufunc_method(name, method, inputs)
        out_given = kwargs.get("out")
        data_in = self.unwrap(inputs, f"cupy.{name}.{method}")
        data_kw = self.unwrap(kwargs, f"cupy.{name}.{method}")
        if isinstance(data_kw.get("out"), np.ndarray):
            data_kw["out"] = (data_kw["out"],)
        if method == "reduceat":
            result = _cupy_add_reduceat(*data_in, **data_kw)
        else:
            result = getattr(ufunc, method)(*data_in, **data_kw)
        self.ledger.launches += 1
        if method == "at":
            return None
        if out_given is not None:
            outs = out_given if isinstance(out_given, tuple) else (out_given,)
            return outs[0] if len(outs) == 1 else outs
        return self._wrap_all(result)

    def _check_ufunc_method(self, name: str, method: str, inputs: tuple) -> None:
        allowed = {"reduce": {"add", "multiply"}, "accumulate": {"add", "multiply"},
                   "reduceat": {"add"}, "at": set(_SCATTER_DTYPES), "outer": None}
        if method not in allowed:
            raise CupyRuleError(f"cupy ufuncs have no method '{method}'")
        if allowed[method] is not None and name not in allowed[method]:
            raise CupyRuleError(f"cupy.{name}.{method} raises NotImplementedError "
                                f"(cupy implements {method} only for {sorted(allowed[method])})")
        if method == "at":
            dtype = str(inputs[0].dtype)
            if dtype not in _SCATTER_DTYPES[name]:
                raise CupyRuleError(f"cupy.{name}.at on {dtype} raises TypeError (its scatter kernel "
                                    f"takes {sorted(_SCATTER_DTYPES[name])})")

    # -- module functions --
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if not hasattr(self.cupy, name):
            raise AttributeError(f"cupy has no '{name}': the kernel would fail on the GPU")
        cp = getattr(self.cupy, name)
        if isinstance(cp, type) or not callable(cp):
            return getattr(np, name) if hasattr(np, name) else cp   # dtypes, constants
        if isinstance(cp, self.cupy.ufunc):
            return UfuncStandIn(self, name)
        if name == "asnumpy":
            return self._asnumpy
        if name == "get_array_module":
            return lambda *a: self
        if not hasattr(np, name):
            raise CupyRuleError(f"cupy.{name} has no numpy twin; the stand-in cannot run it")
        return FunctionStandIn(self, name, getattr(np, name), cupy_signature(cp))

    def _asnumpy(self, a, *args, **kwargs):
        if isinstance(a, DeviceArray):
            self.ledger.syncs.append("asnumpy")
            return np.array(a._a, copy=True)
        return np.asarray(a)


def _all_views(out, inputs: list[np.ndarray]) -> bool:
    """True when ``out`` holds no new device data: views of an input, empty arrays or
    plain Python values (a numpy scalar is a reduction's result: new data)."""
    items = out if isinstance(out, (tuple, list)) else (out,)
    if any(isinstance(o, np.generic) for o in items):
        return False
    arrays = [o for o in items if isinstance(o, np.ndarray) and o.size]
    return all(any(np.may_share_memory(o, i) for i in inputs) for o in arrays)


def _cupy_add_reduceat(array, indices, axis=0, dtype=None, out=None):
    """cupy's ``add.reduceat`` as cupy computes it (cupy/_core/_routines_indexing.pyx,
    ``_add_reduceat``): a cumulative sum over the whole axis in the array's dtype, then the
    differences of it at the indices. In float32 its error grows with the row count."""
    indices = np.append(indices, array.shape[axis])
    shape = [1 if i == axis else d for i, d in enumerate(array.shape)]
    acc = np.cumsum(array, axis, dtype)
    acc = np.append(np.zeros(shape, acc.dtype), acc, axis)
    mask = (indices[:-1] >= indices[1:]).reshape(-1, *([1] * (array.ndim - axis - 1)))
    return np.where(mask, np.take(array, indices[:-1], axis),
                    np.take(acc, indices[1:], axis) - np.take(acc, indices[:-1], axis))


def _same_view(target, value) -> bool:
    """Whether assigning ``value`` to ``target`` is a no-op in cupy (same memory, same layout)."""
    return (isinstance(value, np.ndarray) and isinstance(target, np.ndarray)
            and target.shape == value.shape and target.strides == value.strides
            and target.__array_interface__["data"][0] == value.__array_interface__["data"][0])


class UfuncStandIn:
    """A cupy ufunc: calls go through ``StrictCupy.ufunc``; methods are checked there."""

    def __init__(self, xp: StrictCupy, name: str):
        self._xp, self._np = xp, getattr(np, name)
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return self._xp.ufunc(self._np, "__call__", args, kwargs)

    def __getattr__(self, method: str):
        if method not in ("reduce", "accumulate", "reduceat", "at", "outer"):
            raise AttributeError(f"cupy.ufunc has no attribute '{method}'")
        return lambda *args, **kwargs: self._xp.ufunc(self._np, method, args, kwargs)


class FunctionStandIn:
    """A cupy function: arguments bound against cupy's signature, numpy does the work."""

    def __init__(self, xp: StrictCupy, name: str, np_func, sig):
        self._xp, self._name, self._np, self._sig = xp, name, np_func, sig

    def __call__(self, *args, **kwargs):
        xp, name = self._xp, self._name
        check_call(f"cupy.{name}", self._sig, args, kwargs)
        if name in xp._syncing and not (name == "where" and len(args) + len(kwargs) > 1):
            xp.ledger.syncs.append(name)
        host_ok = name in CREATION
        data_args = xp.unwrap(args, f"cupy.{name}", host_ok)
        data_kwargs = xp.unwrap(kwargs, f"cupy.{name}", host_ok)
        out = self._np(*data_args, **data_kwargs)
        inputs = [a._a for a in _device_arrays(args, kwargs)]
        launches = 0 if name in NO_LAUNCH else None
        if host_ok and not inputs:
            launches = 1                   # host data copied to the device
        return xp.result(out, inputs, launches)


def _device_arrays(args, kwargs) -> list[DeviceArray]:
    found = []

    def walk(o):
        if isinstance(o, DeviceArray):
            found.append(o)
        elif isinstance(o, (list, tuple)):
            for p in o:
                walk(p)
    walk(list(args) + list(kwargs.values()))
    return found


# ------------------------------------------------------------------------ cupy.random

class RandomStandIn:
    """``cupy.random``: its names and signatures; generators draw with numpy's."""

    def __init__(self, xp: StrictCupy):
        self._xp = xp
        self._cp = xp.cupy.random

    def __getattr__(self, name: str):
        if not hasattr(self._cp, name):
            raise AttributeError(f"cupy.random has no '{name}'")
        if name == "default_rng":
            return lambda *a, **k: self._generator(self._cp.Generator, np.random.default_rng, a, k)
        if name == "RandomState":
            return lambda *a, **k: self._generator(self._cp.RandomState, np.random.RandomState, a, k)
        raise CupyRuleError(f"cupy.random.{name} uses the global generator; make a seeded one")

    def _generator(self, cp_class, np_factory, args, kwargs):
        return GeneratorStandIn(self._xp, cp_class, np_factory(*args, **kwargs))


class GeneratorStandIn:
    def __init__(self, xp: StrictCupy, cp_class, np_gen):
        self._xp, self._cp, self._np = xp, cp_class, np_gen

    def __getattr__(self, name: str):
        if not hasattr(self._cp, name):
            raise AttributeError(f"cupy.random.{self._cp.__name__} has no method '{name}'")
        sig = cupy_signature(getattr(self._cp, name))
        method = getattr(self._np, name)

        def draw(*args, **kwargs):
            check_call(f"cupy.random.{self._cp.__name__}.{name}", sig, (self,) + args, kwargs)
            out = method(*args, **kwargs)
            self._xp.ledger.draws.append(str(np.asarray(out).dtype))
            return self._xp.result(out, [], launches=1)
        return draw


# ------------------------------------------------------------------------ running a kernel

@dataclass
class StrictRun:
    """Host copies of a kernel's outputs and what it did on the stand-in."""

    outputs: list[np.ndarray]
    launches: int
    syncs: list[str]
    draws: list[str]
    largest: int


def run_strict(kernel, inputs: list[np.ndarray], args) -> StrictRun:
    """``kernel`` on device copies of ``inputs`` under ``StrictCupy``; every output must be
    a device array (a kernel that returns host data would hand the next GPU op the wrong
    kind of array)."""
    xp = StrictCupy()
    device_inputs = [xp.wrap(np.array(x, copy=True)) for x in inputs]
    xp.ledger.reset()
    outs = kernel(xp, device_inputs, args)
    for i, o in enumerate(outs):
        if not isinstance(o, DeviceArray):
            raise CupyRuleError(f"output {i} is a {type(o).__name__}, not a device array")
    return StrictRun([np.array(o._a, copy=True) for o in outs], xp.ledger.launches,
                     list(xp.ledger.syncs), list(xp.ledger.draws), xp.ledger.largest)


def assert_same_outputs(got: list[np.ndarray], want: list, rtol: float = 1e-5) -> None:
    """The GPU path's outputs equal the CPU path's: exactly for integers and booleans,
    to float rounding for floats (the two paths may sum in different orders)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
        else:
            np.testing.assert_array_equal(g, w)


# Launch counts declared in the registry may differ from a count by this much (dtype
# casts and pads that depend on the shapes are not worth a formula).
LAUNCH_SLACK = 0.25


def check_gpu_kernel(opdef, inputs: list[np.ndarray], args) -> StrictRun:
    """The checks every GPU kernel passes on every conformance case: it keeps to cupy's
    rules (``StrictCupy``), gives the CPU kernel's outputs, reads the device back at most
    once, and launches about as many kernels as its ``launches`` declares (cases with an
    empty input skip that last check: their kernels skip work)."""
    run = run_strict(opdef.kernel, inputs, args)
    assert_same_outputs(run.outputs, list(opdef.kernel(np, [np.array(x, copy=True) for x in inputs], args)))
    assert len(run.syncs) <= 1, f"{opdef.type} reads the device back {len(run.syncs)} times: {run.syncs}"
    if all(np.asarray(x).size for x in inputs):
        from placer.types import TensorType
        declared = opdef.launch_count([TensorType(x.shape, str(x.dtype)) for x in inputs], args)
        assert abs(declared - run.launches) <= max(1, LAUNCH_SLACK * run.launches), (
            f"{opdef.type} declares {declared} launches, its GPU kernel made {run.launches}")
    return run
