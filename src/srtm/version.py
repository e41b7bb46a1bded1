"""The one source of every version SRTM shows.

``__version__`` is the package's, read from the installed metadata so that
``pyproject.toml`` holds the only literal. ``NSQD_VERSION`` is what the broker (and the
controller's nsqlookupd-shaped ``/nodes``) claims towards NSQ clients: the nsqd release
whose protocol it speaks, tagged so a reader can tell it is not nsqd itself.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

#: The nsqd release whose TCP and HTTP protocol the broker implements.
NSQ_VERSION = "1.3.0"
NSQD_VERSION = f"{NSQ_VERSION}-srtm"


def _package_version() -> str:
    try:
        return version("srtm")
    except PackageNotFoundError:
        # Run from a source tree that was never installed: the pyproject beside it.
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__ = _package_version()
