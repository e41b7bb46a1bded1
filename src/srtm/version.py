"""The one source of every version SRTM shows.

``__version__`` is the package's, read from the installed metadata so that
``pyproject.toml`` holds the only literal; it is read on first use, which keeps
``importlib.metadata`` out of every ``import srtm``. ``NSQD_VERSION`` is what the broker
(and the controller's nsqlookupd-shaped ``/nodes``) claims towards NSQ clients: the nsqd
release whose protocol it speaks, tagged so a reader can tell it is not nsqd itself.
"""

from __future__ import annotations

import functools

#: The nsqd release whose TCP and HTTP protocol the broker implements.
NSQ_VERSION = "1.3.0"
NSQD_VERSION = f"{NSQ_VERSION}-srtm"


@functools.cache
def package_version() -> str:
    """The installed package's version (the pyproject's, in a source tree never installed)."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        return version("srtm")
    except PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return package_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
