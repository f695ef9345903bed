"""Where dispatch keeps its choices: an in-memory LRU and an optional on-disk store.

The disk store is one JSON file, ``plans-v1.json`` in ``FASTCONV_CACHE_DIR`` (default: the
user's cache directory, ``$XDG_CACHE_HOME/fastconv`` or ``~/.cache/fastconv``); setting
``FASTCONV_CACHE_DIR`` to an empty string, ``off``, ``0``, ``false``, ``no`` or ``none``
disables it; ``~`` in it is expanded. The file records the
environment it was measured in (GPU, driver, torch, Triton, cuDNN and fastconv versions): a
file from another environment, or one that does not parse, is ignored with one warning and
rewritten on the next save. A save holds an exclusive lock on ``plans-v1.json.lock`` (``flock``:
the kernel drops it when its holder dies) while it merges the entries of the file on disk with
its own and writes a temporary file renamed over the old one (atomic on POSIX), so concurrent
processes lose no entries and readers never see half a file. A save that cannot take the lock
within ``LOCK_TIMEOUT_S`` is skipped with one warning: the cache never blocks a call. Saves
are at least ``SAVE_SPACING_S`` apart: entries stored sooner wait for the next save, or for
the process's exit (a first call of a model at batch 256 stored 241 choices, and rewriting
the growing file for each cost 2-3 s of it). Both stores are bounded (least recently used
entries go first).

PyTorch keeps ``cudnn.benchmark`` choices only for the life of a process (pytorch issue 4392
asked for a persistent cache and was declined); this is that cache.

Below the user's store lies a tuning database shipped with the package (``database=True``:
dispatch's choices): ``fastconv/data/tuning/<gpu>.json``, choices measured by exhaustive
tuning on that GPU for the layers of the bench suites and models (the idea of MIOpen's
find-db and TensorRT's timing caches). It is used for the GPU it was measured on, with the
same candidate list and the same Triton and cuDNN versions (major.minor); another is
ignored with one warning. Its entries come back marked ``partial``: a budgeted call uses
them, exhaustive tuning times the problem again, the user's own store overrides them, and
dispatch validates each before use. ``FASTCONV_TUNING_DB``: another database file, or
``off``.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import json
import math
import os
import tempfile
import threading
import time
import warnings
from typing import Any

from .env import __version__, cudnn_frontend
from .errors import ConvError

FORMAT = 1
FILE_NAME = f"plans-v{FORMAT}.json"
MEMORY_ENTRIES = 4096
DISK_ENTRIES = 20000
LOCK_TIMEOUT_S = 10.0
#: Seconds between two saves of the disk store (``put``; the last entries at exit)
SAVE_SPACING_S = 1.0


#: FASTCONV_CACHE_DIR values that turn the disk store off.
OFF_WORDS = ("", "off", "0", "none", "false", "no", "disable", "disabled")


def cache_dir() -> str | None:
    """The on-disk cache directory (``~`` expanded), or None when disabled. ConvError where
    ``FASTCONV_CACHE_DIR`` names something that is not a directory."""
    env = os.environ.get("FASTCONV_CACHE_DIR")
    if env is not None:
        if env.strip().lower() in OFF_WORDS:
            return None
        path = os.path.expanduser(env)
        if os.path.exists(path) and not os.path.isdir(path):
            raise ConvError(f"FASTCONV_CACHE_DIR: got {env!r}, which is not a directory; "
                            f"expected a directory (created if missing) or 'off'")
        return path
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastconv")


#: Raised whenever a backend's candidate list changes (new tiles or kernels): choices
#: stored before were timed without them, so a file with another revision is rebuilt.
#: 2: packed-group tiles for narrow grouped convolutions (issue 7).
#: 3: pair-word depthwise tiles for 16-bit channels-first forwards (dw_pairs.py).
#: 4: depthwise plane tiles (channels-first tiles over an image's flattened positions).
#: 6: forward row tiles for channels-first rank-1 problems (5: their first, untuned list).
#: 7: dw_roll.py's tiles (channels-last depthwise forward, stride-1 data gradient); the
#:    shipped H100 database was carried over without its 48 depthwise entries, the only
#:    ones whose candidate lists changed; since refilled (benchmarks/tune_models.sh: the
#:    eval bf16 layers of timm mobilenetv3, efficientnet_b0, convnext_tiny, resnext50,
#:    torchvision resnet50 b64, deeplabv3 b8, mobilenet_v3_large, efficientnet_b0,
#:    convnext_tiny and regnet_y_1_6gf).
#: 8: tap-row tiles (forward and weight gradient of 2-15 channels per group and 16-64
#:    kernel-row elements: the RGB stems, ResNeXt's 3x3 groups); the shipped databases
#:    were carried over whole: their 16-bit forward and weight-gradient choices for those
#:    problems (30 on the H100, 28 on the H200) were timed without these tiles and keep
#:    the first calls of the models they serve fast until benchmarks/tune_models.sh
#:    re-times them (a shape the database does not hold times the tiles).
CANDIDATES_REVISION = 8


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """What a stored measurement depends on besides the problem itself."""
    import torch

    env = {"fastconv": __version__, "candidates": str(CANDIDATES_REVISION),
           "torch": torch.__version__,
           "cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version())}
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = "none"
    mod, _ = cudnn_frontend()
    env["cudnn_frontend"] = getattr(mod, "__version__", "?") if mod else "none"
    env["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    env["driver"] = _driver_version()
    return env


def _driver_version() -> str:
    try:
        import ctypes

        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return str(version.value)
    except (OSError, AttributeError):
        pass
    return "none"


#: The package's tuning databases, one file per GPU (see the module docstring).
DATABASE_DIR = os.path.join(os.path.dirname(__file__), "data", "tuning")


def database_file() -> str | None:
    """The tuning database for this machine's GPU (``FASTCONV_TUNING_DB`` overrides; None:
    none, or turned off)."""
    env = os.environ.get("FASTCONV_TUNING_DB")
    if env is not None:
        return None if env.strip().lower() in OFF_WORDS else os.path.expanduser(env)
    gpu = environment()["gpu"]
    return None if gpu == "none" else database_path(gpu)


def database_path(gpu: str) -> str:
    """The package's database file for GPU ``gpu`` (its name, as torch gives it)."""
    slug = "".join(c if c.isalnum() else "-" for c in gpu.lower()).strip("-")
    return os.path.join(DATABASE_DIR, f"{slug}.json")


def database_key(env: dict[str, str] | None = None, capability=None) -> dict[str, str]:
    """What a database entry depends on (see the module docstring): of this machine, or of
    ``env`` (an ``environment()`` recorded elsewhere) on a GPU of ``capability``."""
    if env is None:
        import torch

        env = environment()
        capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return {"gpu": env["gpu"], "capability": str(capability), "candidates": env["candidates"],
            "triton": ".".join(env["triton"].split(".")[:2]),
            "cudnn": env["cudnn"][:-2] if env["cudnn"].isdigit() else env["cudnn"]}


class PlanCache:
    """Thread-safe LRU of JSON-serialisable entries, mirrored to disk on ``store``; with
    ``database`` the package's tuning database answers what the disk store does not."""

    def __init__(self, max_entries: int = MEMORY_ENTRIES, file_name: str = FILE_NAME,
                 database: bool = False):
        self.max_entries = max_entries
        self.file_name = file_name
        self.database = database
        self._db: dict[str, dict] | None = None  # loaded lazily, once
        self._mem: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._lock = threading.RLock()
        self._disk: dict[str, dict] | None = None  # loaded lazily, once
        self._unsaved: dict[str, dict] = {}  # persisted entries not yet saved
        self._saved_at = -math.inf  # time.monotonic() of the last save
        self._at_exit = False  # whether a save at exit is registered
        self._warned = False
        self.hits = self.misses = self.evictions = 0

    # ---------------------------------------------------------------------------- memory
    def get(self, key: str) -> dict | None:
        with self._lock:
            entry = self._mem.get(key)
            if entry is None:
                entry = self._load().get(key)
                if entry is None and self.database:
                    entry = self._database().get(key)
                if entry is not None:
                    self._put(key, entry)
            if entry is None:
                self.misses += 1
                return None
            self._mem.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: str, entry: dict, *, persist: bool = False) -> None:
        """Remember ``entry``; with ``persist`` also write it to the disk store."""
        with self._lock:
            self._put(key, entry)
            if persist and self.path():
                self._unsaved[key] = entry  # until a save succeeds: the next one retries it
                if time.monotonic() - self._saved_at >= SAVE_SPACING_S:
                    self.flush()
                elif not self._at_exit:
                    self._at_exit = True
                    atexit.register(self.flush)

    def discard(self, key: str) -> None:
        """Forget ``key`` in memory (a refused entry; the file keeps it until rewritten)."""
        with self._lock:
            self._mem.pop(key, None)
            if self._disk is not None:
                self._disk.pop(key, None)

    def _put(self, key, entry):
        self._mem[key] = entry
        self._mem.move_to_end(key)
        while len(self._mem) > self.max_entries:
            self._mem.popitem(last=False)
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._mem)

    def items(self) -> list[tuple[str, dict]]:
        with self._lock:
            return list(self._mem.items())

    def clear(self, disk: bool = False) -> None:
        """Forget every entry in memory (entries waiting to be saved are saved first), and
        with ``disk`` delete the disk store too."""
        with self._lock:
            if not disk:
                self.flush()
            self._mem.clear()
            self.hits = self.misses = self.evictions = 0
            self._disk = self._db = None
            self._unsaved.clear()
            path = self.path()
            if disk and path and os.path.exists(path):
                os.remove(path)

    # ------------------------------------------------------------------------------ disk
    def path(self) -> str | None:
        d = cache_dir()
        return os.path.join(d, self.file_name) if d else None

    def disk_entries(self) -> int:
        with self._lock:
            self.flush()
            return len(self._load())

    def _read_file(self) -> dict[str, dict]:
        """Entries of the file on disk if it is ours and from this environment, else {}."""
        path = self.path()
        data = self._document(path, "plan cache", "environment", "; it will be rebuilt")
        if data is None:
            return {}
        if data.get("environment") != environment():
            self._warn(f"fastconv: ignoring the plan cache {path}: it was measured in another "
                       f"environment ({data.get('environment')}); it will be rebuilt")
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}

    def _document(self, path: str | None, what: str, header: str, then: str = "") -> dict | None:
        """The JSON document at ``path`` if it is a fastconv ``what`` of this format (its
        ``entries`` and ``header`` present), else None: absent, or unreadable for any reason
        (one warning; never fatal)."""
        if not path or not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("format") != FORMAT \
                    or not isinstance(data.get("entries"), dict) or header not in data:
                raise ValueError(f"not a fastconv {what}")
        except Exception as exc:
            self._warn(f"fastconv: ignoring the {what} {path} ({type(exc).__name__}: "
                       f"{exc}){then}")
            return None
        return data

    def database_entries(self) -> dict[str, dict]:
        """The tuning database's entries (read-only; {} without a database)."""
        with self._lock:
            return self._database() if self.database else {}

    def _database(self) -> dict[str, dict]:
        if self._db is None:
            self._db = self._read_database()
        return self._db

    def _read_database(self) -> dict[str, dict]:
        """The entries of the tuning database for this GPU, each marked partial (used by
        budgeted tuning, timed again by exhaustive tuning), or {} (one warning when it
        exists but does not apply or does not parse)."""
        path = database_file()
        data = self._document(path, "tuning database", "key")
        if data is None:
            return {}
        if not isinstance(data["key"], dict):
            data["key"] = {}
        here = database_key()
        differ = {k: (data["key"].get(k), v) for k, v in here.items() if data["key"].get(k) != v}
        if differ:
            self._warn(f"fastconv: ignoring the tuning database {path}: measured for "
                       + ", ".join(f"{k} {a} (here {b})" for k, (a, b) in differ.items()))
            return {}
        return {k: dict(v, partial=True, source="database")
                for k, v in data["entries"].items() if isinstance(v, dict)}

    def _load(self) -> dict[str, dict]:
        if self._disk is None:
            self._disk = self._read_file()
        return self._disk

    def export(self) -> dict:
        """The disk store as a portable document (``fastconv plans --export``): its format,
        the environment its entries were measured in, and the entries."""
        with self._lock:
            self.flush()
            entries = self._read_file() if self.path() else {}
        return {"format": FORMAT, "file": self.file_name, "environment": environment(),
                "entries": entries}

    def importable(self, data: Any) -> dict[str, dict]:
        """The entries of a document written by :meth:`export`. ValueError for anything
        else: another format, a document of another store, entries measured in another
        environment (another GPU, driver or library versions, candidate list) or no disk
        store here. Entries are still checked one by one when a call uses them (dispatch
        decodes and validates each)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT \
                or data.get("file") != self.file_name or not isinstance(data.get("entries"), dict):
            raise ValueError(f"not an export of fastconv's {self.file_name} (format {FORMAT})")
        if data.get("environment") != environment():
            theirs = data.get("environment") if isinstance(data.get("environment"), dict) else {}
            differ = {k: (theirs.get(k), v) for k, v in environment().items()
                      if theirs.get(k) != v}
            raise ValueError(f"its {self.file_name} entries were measured in another "
                             f"environment (exported, here): {differ}")
        if not self.path():
            raise ValueError("the disk cache is disabled (FASTCONV_CACHE_DIR)")
        return {k: v for k, v in data["entries"].items()
                if isinstance(k, str) and isinstance(v, dict)}

    def merge(self, entries: dict[str, dict]) -> int:
        """Write ``entries`` (from :meth:`importable`) into the disk store, below the
        machine's own: an entry of a key stored here already is not taken, and imported
        entries only fill the room left under ``DISK_ENTRIES`` (the most recently used
        first, each keeping its own time of use), so they never evict one of the machine's.
        Returns how many were taken."""
        with self._lock:
            return self._save(imported=entries)

    def snapshot(self) -> bytes | None:
        """The disk store's file as it is (None: no file), for :meth:`restore`."""
        path = self.path()
        self.flush()
        if not path or not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    def restore(self, snapshot: bytes | None) -> None:
        """Put back the file :meth:`snapshot` read (an import that failed half-way)."""
        path = self.path()
        with self._lock:
            self._disk = None
            if not path:
                return
            if snapshot is None:
                if os.path.exists(path):
                    os.remove(path)
                return
            with open(path, "wb") as f:
                f.write(snapshot)

    def flush(self) -> None:
        """Save the entries stored since the last save (``SAVE_SPACING_S``) now."""
        with self._lock:
            if self._unsaved and self.path():
                try:
                    self._save()
                except Exception as exc:  # the disk store must never break a call
                    self._warn(f"fastconv: cannot write the plan cache {self.path()}: "
                               f"{type(exc).__name__}: {exc}")

    def _save(self, imported: dict[str, dict] | None = None) -> int:
        """Merge the unsaved entries into the file (under its lock) and rewrite it; with
        ``imported``, those too (see :meth:`merge`; returns how many were taken)."""
        path = self.path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with _file_lock(path + ".lock"):
            disk = self._load()
            disk.update(self._read_file())  # what other processes stored since we loaded
            now = time.time()
            disk.update((k, dict(e, used=now)) for k, e in self._unsaved.items())
            if len(disk) > DISK_ENTRIES:
                oldest = sorted(disk, key=lambda k: disk[k].get("used", 0))
                for old in oldest[:len(disk) - DISK_ENTRIES]:
                    del disk[old]
            taken = sorted((k for k in imported or () if k not in disk),
                           key=lambda k: -_used(imported[k]))[:DISK_ENTRIES - len(disk)]
            disk.update((k, dict(imported[k], used=_used(imported[k]))) for k in taken)
            self._disk = disk
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path),
                                       prefix=f".{self.file_name}-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"format": FORMAT, "environment": environment(), "entries": disk},
                              f)
                os.replace(tmp, path)
                self._unsaved.clear()
                self._saved_at = time.monotonic()
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        return len(taken)

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=4)


def _used(entry: dict) -> float:
    """When an entry was last used (0: never said)."""
    used = entry.get("used")
    return float(used) if isinstance(used, (int, float)) else 0.0


@contextlib.contextmanager
def _file_lock(path: str, timeout: float | None = None):
    """Hold an exclusive ``flock`` on ``path`` (created if missing); TimeoutError after
    ``timeout`` seconds (default ``LOCK_TIMEOUT_S``) of another process holding it. Without
    ``fcntl`` (Windows) saves are unlocked: the rename still keeps the file whole."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    deadline = time.monotonic() + (LOCK_TIMEOUT_S if timeout is None else timeout)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"another process holds {path}") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def encode(value: Any) -> Any:
    """A configuration as JSON (dataclasses become {"__dataclass__": name, fields})."""
    import dataclasses

    if dataclasses.is_dataclass(value):
        return {"__dataclass__": type(value).__name__, **dataclasses.asdict(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return str(value) if isinstance(value, str) else value
    raise TypeError(f"cannot store configuration {value!r}")
