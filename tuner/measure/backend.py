"""Where kernels run and how they are timed: the GPU, or the CPU references.

The search, the benchmark and ``plan()`` talk to a :class:`Backend` and never to
CuPy directly, so the whole tuning loop runs on a machine without a GPU through
:class:`CpuReferenceBackend` (its timings say nothing about any GPU, and every
record carries the device kind ``cpu-reference`` to say so).
"""

from __future__ import annotations

import contextlib
import functools
import platform
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from common.errors import InvalidConfigError
from common.percentile import percentile
from kernels import Family, Prepared
from kernels._cuda import require_cupy

DEVICE_KINDS = ("gpu", "cpu-reference")
SPIN_CYCLES = 100_000  # about 50 µs at Hopper clocks: longer than a Python launch
_SPIN = r"""
extern "C" __global__ void spin_cycles(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""

GATE_PRODUCTS = 16
"""Products :meth:`GpuBackend.time_queued` queues behind one gate: a few launches each, well within the depth of
the launch queue (were it full, the host would wait on the GPU while the GPU waits on the host)."""
GATE_SLOTS = 64
"""Gates a process's pinned flags hold; a queue of more waits for the GPU after every ``GATE_SLOTS`` of them."""
GATE_TIMEOUT_NS = 500_000_000
"""How long a gate holds the stream at most (ns): a product that waits on the GPU itself would hold it forever."""
_GATE = r"""
extern "C" __global__ void wait_for_host(volatile int* flag, unsigned long long timeout_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        if (flag[0] != 0) return;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < timeout_ns);
    flag[1] = 1;  // timed out: the products behind it may have waited on the host
}
"""


@dataclass(frozen=True)
class DeviceInfo:
    """A device as the store records it; tuned results apply to one ``id`` (model and capability)."""

    id: str
    name: str
    kind: str
    compute_capability: str
    sms: int
    memory_bytes: int
    driver: str
    l2_bytes: int = 0

    def record(self, copy_bandwidth_gbs: float | None = None) -> dict[str, Any]:
        return {**asdict(self), "copy_bandwidth_gbs": copy_bandwidth_gbs}


@dataclass(frozen=True)
class Timing:
    """Median and spread of repeated runs, in seconds."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int

    @classmethod
    def from_samples(cls, samples: Sequence[float] | np.ndarray) -> Timing:
        """The median and the 10th and 90th percentiles of the samples (NumPy's, computed without it: a race
        makes a dozen of these)."""
        ordered = sorted(samples.tolist() if isinstance(samples, np.ndarray) else samples)
        return cls(percentile(ordered, 50), percentile(ordered, 10), percentile(ordered, 90), len(ordered))


class Backend(ABC):
    """Uploads, prepares, runs and times kernel families on one device."""

    info: DeviceInfo

    @abstractmethod
    def matrix(self, A: Any) -> Any:
        """The canonical host CSR matrix, moved to where the kernels read it."""

    @abstractmethod
    def vector(self, x: np.ndarray) -> Any: ...

    @abstractmethod
    def to_host(self, y: Any) -> np.ndarray: ...

    @abstractmethod
    def full(self, n: int, value: float, dtype: Any) -> Any: ...

    @abstractmethod
    def prepare(self, family: Family, A: Any, params: dict[str, Any]) -> Prepared: ...

    @abstractmethod
    def run(self, family: Family, prepared: Prepared, x: Any, out: Any) -> Any: ...

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def time(self, fn: Callable[[], object], *, repeats: int = 100, max_duration: float = 1.0,
             flush_l2: bool = False) -> Timing:
        """Median time of ``fn``; ``flush_l2`` evicts the cache between repeats (cold figures)."""

    @abstractmethod
    def time_queued(self, fns: Sequence[Callable[[], object]], *, repeats: int,
                    flush_l2: bool = False) -> list[list[float]]:
        """``repeats`` products of each fn in turn, queued with no wait between them: the seconds of each
        product. Cheaper than :meth:`time` (no wait per product); neither counts the host's time before or
        between a product's launches. ``flush_l2`` evicts the cache before every product (cold figures, as the
        benchmarks time)."""

    @abstractmethod
    def copy_bandwidth_gbs(self) -> float:
        """Measured copy bandwidth (bytes read + written per second / 1e9) of a buffer well above cache."""

    def timed_prepare(self, family: Family, A: Any, params: dict[str, Any]) -> tuple[Prepared, float]:
        """Prepare and return the wall time of the one-time setup (synchronized)."""
        self.synchronize()
        start = time.perf_counter()
        prepared = self.prepare(family, A, params)
        self.synchronize()
        return prepared, time.perf_counter() - start


class GpuBackend(Backend):
    """The current CUDA device through CuPy; times are GPU times from CUDA events."""

    _bandwidths: ClassVar[dict[int, float]] = {}
    """Copy bandwidth by device ordinal, measured once a process (about 13 ms: every plan() makes a backend)."""

    def __init__(self) -> None:
        self.cp = require_cupy()
        self.info = _device_info(self.cp.cuda.Device().id)

    def matrix(self, A: Any) -> Any:
        import cupyx.scipy.sparse as cusp

        return A if cusp.isspmatrix_csr(A) else cusp.csr_matrix(A)  # one already on the GPU stays there

    def vector(self, x: np.ndarray) -> Any:
        return self.cp.asarray(x)

    def to_host(self, y: Any) -> np.ndarray:
        return self.cp.asnumpy(y)

    def full(self, n: int, value: float, dtype: Any) -> Any:
        return self.cp.full(n, value, dtype=dtype)

    def prepare(self, family: Family, A: Any, params: dict[str, Any]) -> Prepared:
        return family.prepare(A, params)

    def run(self, family: Family, prepared: Prepared, x: Any, out: Any) -> Any:
        return family.run(prepared, x, out)

    def synchronize(self) -> None:
        self.cp.cuda.Device().synchronize()

    def time(self, fn: Callable[[], object], *, repeats: int = 100, max_duration: float = 1.0,
             flush_l2: bool = False) -> Timing:
        """GPU time of ``fn`` between two CUDA events, each product queued whole before the GPU starts it.

        Each repeat is queued behind a gate (as :meth:`time_queued`'s): a kernel that holds the stream until
        the host has queued the product (and, when ``flush_l2``, the 2x-L2 memset before it: cold figures),
        so the events bracket the kernels' execution alone, not the Python that launches them, which
        ``cupyx.profiler.benchmark`` counts for kernels of a few microseconds, nor the host's time between
        a product's own launches (csr5's product and its fix-up: on a busy host the unseen benchmark timed
        one at 216 us that its race, gated, had timed at 119 us).
        """
        for _ in range(3):
            fn()
        return Timing.from_samples(self._samples(fn, repeats, flush_l2, max_duration))

    def _samples(self, fn: Callable[[], object], repeats: int, flush_l2: bool,
                 max_duration: float = float("inf")) -> list[float]:
        """Seconds of each of ``repeats`` products, one at a time (at least 5, then until ``max_duration``),
        each behind a gate; where a gate times out (a product that waits on the GPU itself holds it), that
        product and the rest behind a spin as long as a launch instead."""
        cp = self.cp
        flags = _gate_flags()
        gated = True
        start, end = cp.cuda.Event(), cp.cuda.Event()
        samples: list[float] = []
        deadline = time.perf_counter() + max_duration
        while len(samples) < repeats:
            i = len(samples)
            with _gate(flags, 0) if gated else contextlib.nullcontext():
                if flush_l2:
                    self._flush_l2(i, spin=not gated)
                elif not gated:
                    self._spin(i)
                start.record()
                fn()
                end.record()
            end.synchronize()
            if gated and flags[0, 1]:
                gated = False  # its host time may be in the sample: timed again, ungated
                continue
            samples.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
            if time.perf_counter() > deadline and len(samples) >= 5:
                break
        return samples

    def _flush_l2(self, i: int, *, spin: bool = True) -> None:
        flush = _flush_buffer(self.cp.cuda.Device().id, self.info.l2_bytes)
        # The driver's memset: 35 us for 100 MB on an H100 (a fill() writes a byte a thread: 470 us). Then a
        # spin, so that the host has queued the product before the GPU gets to it, even on a busy host (on the
        # memset alone, one race timed a 95 us product at 120 us, where host time falls in the sample);
        # ``spin=False`` behind a gate (:meth:`time_queued`: the product is queued before the GPU gets to it).
        self.cp.cuda.runtime.memsetAsync(flush.data.ptr, i & 0xFF, flush.nbytes, self.cp.cuda.get_current_stream().ptr)
        if spin:
            self._spin(i)

    def _spin(self, i: int, cycles: int = SPIN_CYCLES) -> None:
        _spin_kernel()((1,), (1,), (np.int64(cycles),))

    def time_queued(self, fns: Sequence[Callable[[], object]], *, repeats: int,
                    flush_l2: bool = False) -> list[list[float]]:
        """CUDA events around every product, queued behind gates and waited for once at the end. A gate is a
        kernel that holds the stream until the host has queued the next :data:`GATE_PRODUCTS` products (it
        sets a flag in pinned memory), so they run back to back and no host time falls between a product's
        events, however slow the host is. (Before, a spin after each flush had to outlast the host's next
        launch: on a busy host it did not, and a race on the H100 timed cuSPARSE 1.5-2x slow and picked a
        config 0.9x cuSPARSE's speed.) Where a gate timed out (a product that waits on the GPU itself holds
        it), the products are timed again one at a time, as :meth:`time` times them."""
        cp = self.cp
        queue = [(i, r) for i in range(len(fns)) for r in range(repeats)]
        events: list[list[tuple[Any, Any]]] = [[] for _ in fns]
        flags = _gate_flags()
        end, used, timed_out = None, 0, False
        for k, at in enumerate(range(0, len(queue), GATE_PRODUCTS)):
            slot, used = k % GATE_SLOTS, min(k + 1, GATE_SLOTS)
            if slot == 0 and end is not None:  # every slot used: wait for the gates behind them to pass
                end.synchronize()
                timed_out |= bool(flags[:GATE_SLOTS, 1].any())
            with _gate(flags, slot):
                for i, r in queue[at:at + GATE_PRODUCTS]:
                    if flush_l2:
                        self._flush_l2(r, spin=False)
                    start, end = cp.cuda.Event(), cp.cuda.Event()
                    start.record()
                    fns[i]()
                    end.record()
                    events[i].append((start, end))
        if end is None:
            return [[] for _ in fns]
        end.synchronize()
        if timed_out or flags[:used, 1].any():
            return [self._samples(fn, repeats, flush_l2) for fn in fns]  # each product alone (time()'s way)
        return [[cp.cuda.get_elapsed_time(a, b) * 1e-3 for a, b in mine] for mine in events]

    def copy_bandwidth_gbs(self) -> float:
        device = self.cp.cuda.Device().id
        if device not in self._bandwidths:
            n = max(8 * self.info.l2_bytes, 512 << 20)
            src = self.cp.ones(n, dtype=self.cp.uint8)
            dst = self.cp.empty_like(src)
            t = self.time(lambda: dst.__setitem__(Ellipsis, src), repeats=20, max_duration=2.0)
            self._bandwidths[device] = 2 * n / t.median_s / 1e9
            del src, dst
        return self._bandwidths[device]


@functools.cache
def _device_info(ordinal: int) -> DeviceInfo:
    """What the backend records of device ``ordinal``, read once a process (the properties take 0.8 ms on an
    H200, and every plan() makes a backend)."""
    cp = require_cupy()
    props = cp.cuda.runtime.getDeviceProperties(ordinal)
    name = props["name"].decode()
    cc = f"{props['major']}{props['minor']}"
    return DeviceInfo(
        id=f"{name} (sm_{cc})",
        name=name,
        kind="gpu",
        compute_capability=cc,
        sms=int(props["multiProcessorCount"]),
        memory_bytes=int(props["totalGlobalMem"]),
        driver=str(cp.cuda.runtime.driverGetVersion()),
        l2_bytes=int(props.get("l2CacheSize", 0)),
    )


@functools.cache
def _flush_buffer(ordinal: int, l2_bytes: int) -> Any:
    """The buffer an L2 flush writes on device ``ordinal``: twice the L2, so nothing of the matrix stays
    cached; one a process (every backend writes garbage into it, whatever the stream)."""
    return require_cupy().empty(max(2 * l2_bytes, 64 << 20), dtype=require_cupy().uint8)


@functools.cache
def _spin_kernel() -> Any:
    return require_cupy().RawKernel(_SPIN, "spin_cycles")


@functools.cache
def _gate_kernel() -> Any:
    return require_cupy().RawKernel(_GATE, "wait_for_host")


@contextlib.contextmanager
def _gate(flags: np.ndarray, slot: int) -> Iterator[None]:
    """A gate on the stream while the body queues work behind it: a kernel that waits until ``flags[slot]`` is
    released (or :data:`GATE_TIMEOUT_NS` passes, which it marks there), released on leaving, also where the
    body raised (the stream is not held until the timeout)."""
    flags[slot] = 0
    _gate_kernel()((1,), (1,), (np.uint64(flags[slot:].ctypes.data), np.uint64(GATE_TIMEOUT_NS)))
    try:
        yield
    finally:
        flags[slot, 0] = 1


def _gate_flags() -> np.ndarray:
    """The gates' flags (released, timed out), a row a gate, in pinned host memory: one buffer a thread (two
    threads timing at once keep out of each other's gates). Under unified addressing a kernel reads pinned
    host memory at the host's own address."""
    return _thread_gate_flags(threading.get_ident())


@functools.cache
def _thread_gate_flags(thread: int) -> np.ndarray:
    memory = require_cupy().cuda.alloc_pinned_memory(GATE_SLOTS * 2 * 4)
    return np.frombuffer(memory, dtype=np.int32, count=GATE_SLOTS * 2).reshape(GATE_SLOTS, 2)


class CpuReferenceBackend(Backend):
    """The families' NumPy references timed on the CPU: exercises the tuning loop without a GPU.

    Its figures are the speed of the references on this CPU and say nothing about any GPU.
    """

    def __init__(self) -> None:
        cpu = platform.processor() or platform.machine() or "cpu"
        self.info = DeviceInfo(
            id=f"cpu-reference ({cpu})", name=cpu, kind="cpu-reference", compute_capability="cpu",
            sms=0, memory_bytes=0, driver=f"numpy {np.__version__}",
        )
        self._bandwidth: float | None = None

    def matrix(self, A: Any) -> Any:
        return A

    def vector(self, x: np.ndarray) -> Any:
        return np.asarray(x)

    def to_host(self, y: Any) -> np.ndarray:
        return np.asarray(y)

    def full(self, n: int, value: float, dtype: Any) -> Any:
        return np.full(n, value, dtype=dtype)

    def prepare(self, family: Family, A: Any, params: dict[str, Any]) -> Prepared:
        return family.prepare_reference(A, params)

    def run(self, family: Family, prepared: Prepared, x: Any, out: Any) -> Any:
        return family.run_reference(prepared, x, out)

    def synchronize(self) -> None:
        pass

    def time(self, fn: Callable[[], object], *, repeats: int = 100, max_duration: float = 1.0,
             flush_l2: bool = False) -> Timing:
        fn()
        samples = []
        deadline = time.perf_counter() + max_duration
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
            if time.perf_counter() > deadline and len(samples) >= 3:
                break
        return Timing.from_samples(samples)

    def time_queued(self, fns: Sequence[Callable[[], object]], *, repeats: int,
                    flush_l2: bool = False) -> list[list[float]]:
        samples = []
        for fn in fns:
            mine = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                mine.append(time.perf_counter() - start)
            samples.append(mine)
        return samples

    def copy_bandwidth_gbs(self) -> float:
        if self._bandwidth is None:
            src = np.ones(64 << 20, dtype=np.uint8)
            dst = np.empty_like(src)
            t = self.time(lambda: np.copyto(dst, src), repeats=10, max_duration=1.0)
            self._bandwidth = 2 * src.nbytes / t.median_s / 1e9
        return self._bandwidth


def get_backend(device: str = "gpu") -> Backend:
    """``'gpu'`` (raises NoDeviceError without one) or ``'cpu-reference'``."""
    if device == "gpu":
        return GpuBackend()
    if device == "cpu-reference":
        return CpuReferenceBackend()
    raise InvalidConfigError(f"unknown device {device!r}; choose one of {list(DEVICE_KINDS)}")
