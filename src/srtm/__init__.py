"""SRTM: scalable real-time pub/sub messaging with DRL-aware load distribution."""


def __getattr__(name: str) -> str:
    # ``srtm.__version__`` on first use (``srtm.version``), not on every import of srtm
    if name == "__version__":
        from srtm.version import package_version

        return package_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
