"""GPUMEM_AUTO_INSTALL=1: gpumem becomes PyTorch's CUDA allocator as soon as torch is imported.

gpumem_autoinstall.pth (installed into site-packages with the package) calls arm() at interpreter
start-up when GPUMEM_AUTO_INSTALL is set to anything but "" or "0". arm() adds an import hook that
waits for `import torch`; once torch's module has run, gpumem.install() runs with the settings of
GPUMEM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF. When it cannot install, the
import of torch fails with gpumem's reason: PyTorch's allocator never stands in silently.
"""

import importlib.abc
import sys


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader  # torch sees its own loader
        self._loader.exec_module(module)
        import gpumem  # noqa: PLC0415

        try:
            gpumem.install()
        except gpumem.GpumemError as e:
            raise ImportError(f"GPUMEM_AUTO_INSTALL is set, but gpumem could not be installed "
                              f"as PyTorch's CUDA allocator: {e}") from None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # once
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def arm():
    if "torch" in sys.modules:  # too late for the hook: install now
        import gpumem  # noqa: PLC0415

        gpumem.install()
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
