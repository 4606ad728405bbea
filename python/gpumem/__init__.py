"""gpumem for PyTorch: gpumem's caching allocator as PyTorch's CUDA allocator, and gpumem-replay.

    import gpumem
    gpumem.install("policy:stitch")       # before the first CUDA tensor
    x = torch.empty(1 << 30, device="cuda")
    print(gpumem.memory_summary())

    gpumem.replay("snapshot.pickle", device_memory="24GiB", configs=["policy:classic", "policy:stitch"])

    gpumem.snapshot_on_oom("/shared/oom")  # a replayable snapshot per rank at an out-of-memory error

    with gpumem.legacy_segments():         # cudaMalloc memory, e.g. for CUDA IPC
        buffer = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")

The replay side needs neither CUDA nor torch. install() needs libgpumem_torch.so, which is built
when the package is installed into an environment that has torch (README.md, "The Python
package").
"""

import contextlib
import ctypes
import json
import os
import pickle
import socket
import subprocess
import sys

from . import _build_info

__version__ = _build_info.VERSION
__all__ = [
    "GpumemError", "ConfigError", "install", "is_installed", "legacy_segments", "memory_summary",
    "stats", "plugin_path", "replay_path", "replay", "snapshot_on_oom", "torch_version",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_lib = None  # the plugin, once this package loaded it


class GpumemError(RuntimeError):
    """gpumem cannot do what was asked; the message says why."""


class ConfigError(GpumemError, ValueError):
    """A malformed allocator setting (gpumem.install's config, GPUMEM_ALLOC_CONF, ...)."""


def plugin_path():
    """The path of libgpumem_torch.so in this package. Raises GpumemError, saying why, when the
    package was built without it (no torch or no CUDA toolkit when it was installed)."""
    if not _build_info.PLUGIN:
        raise GpumemError(
            "gpumem: this installation has no libgpumem_torch.so: " + _build_info.PLUGIN_WHY +
            ". Reinstall the package where torch and the CUDA toolkit are installed: "
            "pip install <gpumem clone> (with scikit-build-core installed, "
            "pip install --no-build-isolation <gpumem clone> builds in this environment)")
    return os.path.join(_HERE, "lib", "libgpumem_torch.so")


def replay_path():
    """The path of the gpumem-replay executable in this package."""
    return os.path.join(_HERE, "bin", "gpumem-replay")


def torch_version():
    """The torch version libgpumem_torch.so was built against ("" without the plugin)."""
    return _build_info.TORCH_VERSION


def _declare(lib):
    lib.gpumem_installed.restype = ctypes.c_int
    lib.gpumem_last_error.restype = ctypes.c_char_p
    lib.gpumem_install.restype = ctypes.c_int
    lib.gpumem_install.argtypes = [ctypes.c_char_p]
    for f in (lib.gpumem_memory_summary, lib.gpumem_memory_stats_json):
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def _loaded_plugin():
    """The plugin if it is in this process (loaded by this package or LD_PRELOAD), else None."""
    if _lib is not None:
        return _lib
    if _build_info.PLUGIN:
        try:
            return _declare(ctypes.CDLL(plugin_path(), mode=os.RTLD_NOLOAD))
        except OSError:
            pass
    try:  # LD_PRELOAD of another copy (a build folder's)
        everything = ctypes.CDLL(None)
        everything.gpumem_installed  # noqa: B018 (raises AttributeError when absent)
        everything.gpumem_install
        return _declare(everything)
    except AttributeError:
        return None


def is_installed():
    """True when gpumem is PyTorch's CUDA allocator in this process."""
    lib = _loaded_plugin()
    return lib is not None and lib.gpumem_installed() == 1


def install(config=None):
    """Makes gpumem PyTorch's CUDA allocator, configured with `config` (PYTORCH_CUDA_ALLOC_CONF
    syntax plus gpumem's keys, e.g. "policy:stitch,max_split_size_mb:256") on top of
    GPUMEM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF. Call it before the first CUDA
    tensor. Imports torch.

    Raises ConfigError for a malformed setting, and GpumemError when gpumem cannot be installed:
    no plugin in this installation, a torch other than the one it was built against, too late
    (PyTorch's CUDA allocator already initialised), or already installed with other settings
    (install() without config when gpumem is installed does nothing). PyTorch's own allocator is
    never used in gpumem's place without an exception.
    """
    global _lib
    if config is not None and not isinstance(config, str):
        raise TypeError(f"gpumem.install: config must be a str or None, not {type(config).__name__}")
    path = plugin_path()
    import torch  # noqa: PLC0415 (imported only when asked for)

    if torch.__version__ != _build_info.TORCH_VERSION:
        raise GpumemError(
            f"gpumem: libgpumem_torch.so was built against torch {_build_info.TORCH_VERSION}, but "
            f"this process runs torch {torch.__version__} (from {os.path.dirname(torch.__file__)}); "
            "reinstall gpumem with this torch: pip install --force-reinstall <gpumem clone>")
    lib = _loaded_plugin()
    if lib is None:
        previous = os.environ.get("GPUMEM_TORCH_INSTALL_AT_LOAD")
        os.environ["GPUMEM_TORCH_INSTALL_AT_LOAD"] = "0"  # gpumem_install below, with `config`
        try:
            lib = _declare(ctypes.CDLL(path))
        except OSError as e:
            raise GpumemError(f"gpumem: cannot load {path}: {e}") from None
        finally:
            if previous is None:
                del os.environ["GPUMEM_TORCH_INSTALL_AT_LOAD"]
            else:
                os.environ["GPUMEM_TORCH_INSTALL_AT_LOAD"] = previous
        _lib = lib
    if lib.gpumem_installed() == 1 and config is None:
        return
    rc = lib.gpumem_install(None if config is None else config.encode())
    if rc == 0:
        return
    message = lib.gpumem_last_error().decode(errors="replace")
    if rc == -2:
        raise ConfigError(message)
    raise GpumemError(message)


def _device_index(device):
    import torch  # noqa: PLC0415

    if device is None:
        return torch.cuda.current_device()
    return torch.cuda._utils._get_device_index(device, optional=True)


def _text(function, what, device):
    lib = _loaded_plugin()
    if lib is None or lib.gpumem_installed() != 1:
        raise GpumemError(f"gpumem.{what}: gpumem is not PyTorch's CUDA allocator in this process "
                          "(call gpumem.install() before the first CUDA tensor)")
    index = _device_index(device)
    n = function(lib)(index, None, 0)
    if n == ctypes.c_size_t(-1).value:
        raise GpumemError(f"gpumem.{what}: " + lib.gpumem_last_error().decode(errors="replace"))
    buf = ctypes.create_string_buffer(n + 1)
    function(lib)(index, buf, n + 1)
    return buf.value.decode()


def memory_summary(device=None):
    """gpumem's summary of `device` (default: the current one): PyTorch's memory_summary table,
    then gpumem's section (largest free block, fragmentation, device calls, policy, settings)."""
    return _text(lambda lib: lib.gpumem_memory_summary, "memory_summary", device)


def stats(device=None):
    """gpumem's statistics of `device` (default: the current one) as a dict with the keys of
    torch.cuda.memory_stats() ("allocated_bytes.all.current", ...)."""
    return json.loads(_text(lambda lib: lib.gpumem_memory_stats_json, "stats", device))


@contextlib.contextmanager
def legacy_segments():
    """Within the block, new allocations of PyTorch's default pool come from cudaMalloc segments
    under gpumem's expandable and stitch policies, as torch.cuda.memory._set_allocator_settings(
    "expandable_segments:False") gives them; for memory that CUDA IPC (cudaIpcGetMemHandle) must
    share or a library needs as cudaMalloc memory. After it, the state before the block (the
    configured policy, unless the switch was already on). Tensors made inside stay valid after it
    and may be freed anywhere. Under policy:classic every segment is a cudaMalloc one already;
    private pools (MemPool, CUDA graphs) keep their policy. Raises GpumemError when gpumem is not
    PyTorch's CUDA allocator in this process."""
    lib = _loaded_plugin()
    if lib is None or lib.gpumem_installed() != 1:
        raise GpumemError("gpumem.legacy_segments: gpumem is not PyTorch's CUDA allocator in this "
                          "process (call gpumem.install() before the first CUDA tensor)")
    try:
        switch = lib.gpumem_set_legacy_segments
    except AttributeError:
        raise GpumemError("gpumem.legacy_segments: the loaded libgpumem_torch.so is older than "
                          "this package; reinstall gpumem") from None
    switch.restype = ctypes.c_int
    switch.argtypes = [ctypes.c_int]
    before = switch(1)
    if before < 0:
        raise GpumemError("gpumem.legacy_segments: " +
                          lib.gpumem_last_error().decode(errors="replace"))
    try:
        yield
    finally:
        switch(before)


def _size(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"gpumem.replay: {name} must be a size in bytes (int) or a str such as "
                        f"'24GiB', not {value!r}")
    return f"{value}B" if isinstance(value, int) else value


def replay(trace, device_memory=None, configs=None, allocator="gpumem", find_min_memory=False,
           steps=None, overhead=None, timeout=None):
    """Replays `trace` (a path, or a list of paths: one per rank) with gpumem-replay and returns
    its --json records: a list of dicts, one per configuration (and trace).

    device_memory, overhead: int (bytes) or a size string ("24GiB"); default: gpumem-replay's.
    configs: None (gpumem-replay's default: "recorded" for a PyTorch snapshot), or a list of
    configurations (PYTORCH_CUDA_ALLOC_CONF syntax plus "policy:..."), one record each.
    allocator: "gpumem", "pytorch" or "cub" (PyTorch's and CUB's own allocators on the CUDA
    simulator: the package has them when the CUDA toolkit, and for "pytorch" torch, were found at
    install time; configs are then their own settings). find_min_memory: adds
    min_device_memory_bytes. steps: replays the trace as N training steps. Raises ValueError for bad arguments and GpumemError when the trace cannot be
    read, with gpumem-replay's message.
    """
    traces = [trace] if isinstance(trace, (str, os.PathLike)) else list(trace)
    if not traces:
        raise ValueError("gpumem.replay: no trace")
    cmd = [replay_path(), *[os.fspath(t) for t in traces], "--json", "--progress", "never"]
    if allocator != "gpumem":
        cmd += ["--allocator", str(allocator)]
    if device_memory is not None:
        cmd += ["--device-memory", _size(device_memory, "device_memory")]
    if overhead is not None:
        cmd += ["--overhead", _size(overhead, "overhead")]
    if configs is not None:
        if isinstance(configs, str):
            raise TypeError("gpumem.replay: configs is a list of configurations, e.g. [" +
                            repr(configs) + "]")
        configs = [str(c) for c in configs]
        if not configs:
            raise ValueError("gpumem.replay: configs is empty")
        cmd += ["--config", configs[0]] if len(configs) == 1 else ["--compare", *configs]
    if find_min_memory:
        cmd.append("--find-min-memory")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gpumem.replay: steps must be a positive int, not {steps!r}")
        cmd += ["--steps", str(steps)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode == 2:
        raise ValueError("gpumem.replay: " + p.stderr.strip())
    if p.returncode != 0:
        raise GpumemError("gpumem.replay: " + (p.stderr.strip() or f"exit status {p.returncode}"))
    return json.loads(p.stdout)


# --- snapshot on out-of-memory ------------------------------------------------------------------

# A process writes at most this many snapshots (as libgpumem_torch.so's oom_snapshot key): a
# program that catches its out-of-memory errors and goes on must not fill the disk.
OOM_SNAPSHOT_MAX_FILES = 3
_oom = {"dir": None, "written": 0, "attached": False}


def _file_name_safe(text):
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in text)
    return safe or "_"


def _oom_snapshot_name(n):
    """rank<RANK>-<host>-pid<pid>-oom<n>.pickle, RANK from RANK, else LOCAL_RANK, else 0: the name
    libgpumem_torch.so's oom_snapshot key gives its files (gpumem/torch/oom_snapshot.hpp)."""
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    host = socket.gethostname() or "unknown-host"
    return f"rank{_file_name_safe(rank)}-{_file_name_safe(host)}-pid{os.getpid()}-oom{n}.pickle"


def _keep_last_oom(trace):
    """The trace without the oom events before its last: out-of-memory errors the program caught
    earlier allocated nothing, and gpumem-replay takes the first oom event for the failure."""
    ooms = [i for i, e in enumerate(trace) if e.get("action") == "oom"]
    drop = set(ooms[:-1])
    return [e for i, e in enumerate(trace) if i not in drop]


def _on_out_of_memory(device, alloc, device_allocated, device_free):
    """PyTorch's out-of-memory observer: writes the snapshot, one line on stderr. Never raises:
    the out-of-memory error is what the program must see."""
    import torch  # noqa: PLC0415

    directory = _oom["dir"]
    try:
        if _oom["written"] >= OOM_SNAPSHOT_MAX_FILES:
            print(f"gpumem: out of memory on cuda:{device}: no snapshot written (this process "
                  f"wrote {OOM_SNAPSHOT_MAX_FILES} already, the most it writes)", file=sys.stderr)
            return
        snapshot = torch.cuda.memory._snapshot()
        traces = snapshot.get("device_traces", [])
        if 0 <= device < len(traces):
            traces[device] = _keep_last_oom(traces[device])
        os.makedirs(directory, exist_ok=True)
        path = os.path.abspath(os.path.join(directory, _oom_snapshot_name(_oom["written"] + 1)))
        partial = path + ".partial"
        try:
            with open(partial, "wb") as f:
                pickle.dump(snapshot, f)
            os.replace(partial, path)
        except BaseException:
            if os.path.exists(partial):
                os.remove(partial)
            raise
        _oom["written"] += 1
        print(f"gpumem: out of memory on cuda:{device}: snapshot written to {path}; "
              f"replay it with: gpumem-replay {path}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 (reported, never raised)
        print(f"gpumem: out of memory on cuda:{device}: the snapshot was not written to "
              f"{directory}: {e}", file=sys.stderr)


def snapshot_on_oom(directory, max_entries=20000, stacks="python"):
    """Writes a PyTorch memory snapshot into `directory` whenever this process runs out of CUDA
    memory, before torch.OutOfMemoryError is raised, and says on stderr where and how to replay
    it: `gpumem-replay DIR/*.pickle` replays every rank's up to the request that failed.

    Files: rank<RANK>-<host>-pid<pid>-oom<N>.pickle (RANK from RANK, else LOCAL_RANK, else 0), at
    most 3 per process; `directory` is made if missing. For PyTorch's own allocator and for gpumem's
    alike: it turns on torch.cuda.memory._record_memory_history(max_entries=max_entries,
    stacks=stacks) (each entry keeps its Python stack: the default bounds the file to some tens of
    MB) and attaches an out-of-memory observer. Initialises CUDA: with gpumem, call it after
    gpumem.install(). With libgpumem_torch.so, the oom_snapshot:DIR key does the same in C++
    (use one of the two). Calling it again changes the directory and the history's size.
    """
    import torch  # noqa: PLC0415

    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"gpumem.snapshot_on_oom: max_entries must be a positive int, not "
                         f"{max_entries!r}")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)  # an unusable directory is an error now, not at the OOM
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks=stacks)
    _oom["dir"] = directory
    if not _oom["attached"]:
        torch._C._cuda_attach_out_of_memory_observer(_on_out_of_memory)
        _oom["attached"] = True
