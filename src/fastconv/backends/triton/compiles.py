"""Triton kernels compiled ahead, in worker processes, while the caller goes on.

A first call of a model compiles one Triton kernel after another: 1-3 s each on the GPU
host, most of it in Triton's MLIR and LLVM passes, which hold the GIL (two threads compile
four kernels 1.4x faster than one, not 2x). So the kernels are compiled by worker
processes instead, into Triton's on-disk kernel cache; the caller's own compile is then
that cache's hit (milliseconds).

``collecting()`` runs a launch without compiling: Triton's ``jit_cache_hook`` is asked
before every compile and, inside the block, records the kernel's specialisation (Triton's
own serialised form, what ``JITFunction.preload`` reads) and says "skip". The launch then
launches nothing (``launch._launch`` returns None); kernels compiled before still launch.
Each recorded specialisation becomes one job of a process pool (``spawn``: CUDA is never
initialised in a worker; the GPU's target and the caller's Triton settings at the submit,
its ``TRITON_*`` environment and ptxas version, travel with the job). A worker imports the
kernel's module and calls ``preload``, which compiles for that target into the caller's
cache under the key the caller's own compile would look for, then builds the kernel's
launcher there too.

``FASTCONV_COMPILE_WORKERS``: the number of worker processes (default: the CPU cores less
one, at most 8); 0 turns this off (every kernel compiles in the caller, as Triton does).
The workers start at the first job and stop ``IDLE_S`` seconds after the last one ends (each
holds an imported torch: hundreds of MB); a pool whose worker died is replaced.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import concurrent.futures.process  # noqa: F401 (its exit hook registered before ours: see the end)
import contextlib
import contextvars
import importlib
import multiprocessing
import os
import sys
import threading

from triton import knobs

from ...errors import ConvError

_COLLECTING: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "fastconv_collecting", default=None)
_LOCK = threading.Lock()
_POOL: cf.ProcessPoolExecutor | None = None
_JOBS: dict[str, cf.Future] = {}  # specialisation (JSON) -> its compile
_CHAINED: list = []  # a jit_cache_hook installed before ours, still called first
IDLE_S = 10.0  # seconds without jobs after which the workers stop


def workers() -> int:
    """How many worker processes compile (``FASTCONV_COMPILE_WORKERS``); 0: none."""
    raw = os.environ.get("FASTCONV_COMPILE_WORKERS", "")
    if raw.strip() == "":
        return max(1, min(8, (os.cpu_count() or 2) - 1))
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ConvError(f"FASTCONV_COMPILE_WORKERS: got {raw!r}; allowed: an integer >= 0")
    return n


class collecting:
    """``with collecting() as jobs:`` a launch inside compiles nothing; ``jobs`` holds the
    futures of the compiles it would have needed (submitted to the pool as they are
    found). Kernels already compiled in this process launch as usual."""

    def __enter__(self) -> list[cf.Future]:
        _install_hook()
        self.jobs: list[cf.Future] = []
        self._token = _COLLECTING.set(self.jobs)
        return self.jobs

    def __exit__(self, *exc) -> None:
        _COLLECTING.reset(self._token)


def pending() -> list[cf.Future]:
    """The compiles not finished yet."""
    with _LOCK:
        return [f for f in _JOBS.values() if not f.done()]


def wait(timeout: float | None = None) -> bool:
    """Block until every submitted compile has finished (or failed); False if ``timeout``
    seconds passed first."""
    done, not_done = cf.wait(pending(), timeout=timeout)
    return not not_done


#: the thread creating Triton's GPU driver ahead of its first use (``warm_driver``)
_DRIVER_THREAD: threading.Thread | None = None


def warm_driver() -> None:
    """Create Triton's GPU driver in a background thread, once per process. On a cold Triton
    cache its creation compiles a C module with the system's compiler (0.36 s of a timm
    resnet50 first call on the H200 host, spent waiting for that compiler at the first
    Triton kernel), so started when a model is optimized it overlaps the model's first
    layers. A failure is left for the first real use to report."""
    global _DRIVER_THREAD
    with _LOCK:
        if _DRIVER_THREAD is not None:
            return
        _DRIVER_THREAD = threading.Thread(target=_create_driver, daemon=True,
                                          name="fastconv-triton-driver")
        _DRIVER_THREAD.start()


def _create_driver() -> None:
    try:
        from triton.runtime import driver

        driver.active  # noqa: B018 (the property creates it)
    except Exception:
        pass


def driver_ready() -> None:
    """Wait for ``warm_driver``'s thread if it runs: Triton's driver config is not
    thread-safe, and a driver created beside it would compile the same module again."""
    thread = _DRIVER_THREAD
    if thread is not None and thread.is_alive():
        thread.join()


def _install_hook() -> None:
    with _LOCK:
        current = knobs.runtime.jit_cache_hook
        if current is _hook:
            return
        _CHAINED[:] = [current] if current is not None else []
        knobs.runtime.jit_cache_hook = _hook


def _hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    """Triton asks before compiling: True skips the compile (inside ``collecting``)."""
    for other in _CHAINED:
        if other(key=key, repr=repr, fn=fn, compile=compile,
                 is_manual_warmup=is_manual_warmup, already_compiled=already_compiled):
            return True
    jobs = _COLLECTING.get()
    if jobs is None:
        return None
    jobs.append(_submit(fn.module, fn.name, compile["specialization_data"]))
    return True


def _submit(module: str, name: str, data: str) -> cf.Future:
    from triton.runtime import driver

    target = driver.active.get_current_target()
    with _LOCK:
        job = _JOBS.get(data)
        if job is None:
            args = (_compile, module, name, data,
                    (target.backend, target.arch, target.warp_size), _settings(target))
            with _main_hidden():  # (a submit starts the workers it needs)
                try:
                    job = _pool().submit(*args)
                except cf.process.BrokenProcessPool:  # a worker died: a new pool
                    _close()
                    job = _pool().submit(*args)
            _JOBS[data] = job
            job.add_done_callback(_idle_check)
        return job


def _settings(target) -> dict[str, str]:
    """What the caller's Triton would compile with now, for a job to compile with the same:
    its ``TRITON_*`` environment (the cache directory, ptxas, ...; read at each compile) and,
    for CUDA, the ptxas version its cache keys hold. Triton reads that version once per
    process (``get_ptxas_version``, cached), so a ptxas named later (torch.compile's Inductor
    names torch's own when it compiles in the process, and sets ``TRITON_CACHE_DIR``) leaves
    the caller's keys on the first version while a worker started after would read the new
    one: its kernels then missed the caller's cache and compiled again in the caller's
    thread, each at its first launch (minutes of a model's first calls on the H200)."""
    settings = _triton_env()
    if target.backend == "cuda":
        try:
            from triton.backends.nvidia.compiler import get_ptxas_version

            settings["TRITON_MOCK_PTX_VERSION"] = get_ptxas_version(target.arch)
        except Exception:  # another Triton's layout: the worker reads its own
            pass
    return settings


@contextlib.contextmanager
def _main_hidden():
    """Workers started inside leave the caller's main module alone. ``spawn`` runs the
    caller's script again in every new worker (as ``__mp_main__``, to find the functions it
    defines): a training script without an ``if __name__ == "__main__"`` guard would build
    its model and touch its GPU there, then fail to start workers of its own, breaking the
    pool. The workers need nothing from it (their jobs are this module's functions), so
    while a submit starts them ``__main__`` shows neither a file nor a module spec, which
    is what tells multiprocessing to import it."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _pool() -> cf.ProcessPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = cf.ProcessPoolExecutor(max(1, workers()),
                                       mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_lower_priority)
    return _POOL


#: How much lower the workers' CPU priority is than the caller's (POSIX ``nice``): their
#: compiles run while the caller's eager calls, host-bound, go on (at the same priority,
#: 8 workers compiling in the background doubled a model's eager step time on the H100's
#: 16-core host; benchmarks/NOTES.md).
NICENESS = 10


def _lower_priority() -> None:
    """Worker initializer: run at a lower CPU priority (where the platform has one)."""
    if hasattr(os, "nice"):
        try:
            os.nice(NICENESS)
        except OSError:
            pass


def _close() -> None:
    """Stop the workers (jobs still queued are cancelled; called holding ``_LOCK``)."""
    global _POOL
    if _POOL is not None:
        _POOL.shutdown(wait=False, cancel_futures=True)
        _POOL = None


def _idle_check(_job=None) -> None:
    """After a job ends: stop the workers once ``IDLE_S`` pass with none running."""
    if not pending():
        timer = threading.Timer(IDLE_S, _close_if_idle)
        timer.daemon = True
        timer.start()


def _close_if_idle() -> None:
    with _LOCK:
        if all(f.done() for f in _JOBS.values()):
            _close()


def _close_at_exit() -> None:
    """The process is ending and will use none of the kernels still compiling: queued jobs
    are dropped and running ones ended (the workers terminated), so that the exit does not
    wait for them (one running job of 120 s held an exit for all of it). Triton writes
    each cache file by renaming a finished one and indexes a kernel's files last: a compile
    ended halfway is not found later, and compiles again where it is needed."""
    with _LOCK:
        # (Python 3.14's ProcessPoolExecutor.terminate_workers; before it, this: taken
        # before the shutdown, which drops the executor's reference to them)
        procs = list((getattr(_POOL, "_processes", None) or {}).values())
        _close()
        for proc in procs:
            proc.terminate()


# Registered after the executors' own exit hook (its module is imported above), so it runs
# before that hook, which waits for every job not cancelled (the hooks run last first).
getattr(threading, "_register_atexit", atexit.register)(_close_at_exit)


# ------------------------------------------------------------------------- worker side
class _TargetDriver:
    """What ``preload`` and ``compile`` ask of Triton's driver in a worker: the device and
    its target, sent by the caller. Nothing here touches a GPU."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def is_active(self) -> bool:
        return True


def _compile(module: str, name: str, data: str, target: tuple, settings: dict) -> str:
    """Worker: compile one recorded specialisation into the kernel cache, with the caller's
    Triton settings (``_settings``); returns the kernel's name."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    _apply(settings)
    driver.set_active(_TargetDriver(GPUTarget(*target)))
    kernel = importlib.import_module(module)
    for part in name.split("."):
        kernel = getattr(kernel, part)
    while not hasattr(kernel, "preload"):  # an autotuner or heuristics wrapper
        kernel = kernel.fn
    compiled = kernel.preload(data)
    if target[0] == "cuda":
        _build_launcher(compiled)
    return name


def _apply(settings: dict) -> None:
    """Worker: the caller's ``TRITON_*`` environment in place of the one the worker started
    with (the ptxas version among it is the caller's, fixed for its process: the worker's
    cached one, read from it, stays right)."""
    for key in _triton_env().keys() - settings.keys():
        del os.environ[key]
    os.environ.update(settings)


def _triton_env() -> dict[str, str]:
    """This process's ``TRITON_*`` environment variables."""
    return {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}


def _build_launcher(compiled) -> None:
    """The kernel's host-side launcher, a C module Triton builds (a C compiler run, about a
    second) into the same cache at the caller's first launch of each signature; built here,
    that launch finds it. Best effort: Triton versions differ in how they launch, and the
    build needs the CUDA driver library (not on a CPU-only machine)."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(compiled.src, compiled.metadata)
    except Exception:
        pass
