"""The public façade of rdmakit.doca (trio's test_exports)."""

import importlib
import pkgutil

import rdmakit.doca

#: Modules used as a namespace (``from rdmakit.doca import aio``), not flattened into the façade.
NAMESPACES = ["aio", "rtt", "verbs_glue"]
MODULES = sorted(
    name
    for info in pkgutil.iter_modules(rdmakit.doca.__path__)
    if not (name := info.name).startswith("_") and name not in NAMESPACES
)


def test_every_module_is_covered() -> None:
    """The façade is built from these modules; a new module must be added to it."""
    assert MODULES == [
        "backend",
        "buf",
        "comch",
        "comch_tasks",
        "comm_channel",
        "ctx",
        "descriptor",
        "device",
        "dma",
        "dma_tasks",
        "errors",
        "graph",
        "inventory",
        "local",
        "mmap",
        "pe",
        "rdma",
        "rdma_cm",
        "rdma_conns",
        "rdma_jobs",
        "rdma_props",
        "rdma_tasks",
        "shm",
        "soft",
        "soft_cm",
        "sync_event",
        "sync_event_dpu",
        "sync_event_remote",
        "sync_event_tasks",
        "tasks",
        "workq",
    ]


def test_facade_exports_each_modules_public_names() -> None:
    """Every name a module lists in __all__ is re-exported by rdmakit.doca, as the same object."""
    for name in MODULES:
        module = importlib.import_module(f"rdmakit.doca.{name}")
        for public in module.__all__:
            assert public in rdmakit.doca.__all__, f"rdmakit.doca.{name}.{public} is not exported"
            assert getattr(rdmakit.doca, public) is getattr(module, public)


def test_facade_exports_nothing_else() -> None:
    """__all__ is sorted, has no duplicates and every entry comes from some module's __all__."""
    listed = rdmakit.doca.__all__
    assert len(set(listed)) == len(listed)
    from_modules = {
        public for name in MODULES for public in importlib.import_module(f"rdmakit.doca.{name}").__all__
    }
    assert set(listed) == from_modules


def test_public_names_resolve() -> None:
    """Every exported name exists."""
    for public in rdmakit.doca.__all__:
        assert hasattr(rdmakit.doca, public), public


def test_namespace_modules_import() -> None:
    """``rdmakit.doca.aio`` is public as a module: its names stay out of the flat façade."""
    for name in NAMESPACES:
        module = importlib.import_module(f"rdmakit.doca.{name}")
        assert module.__all__
        assert not set(module.__all__) & set(rdmakit.doca.__all__)
