"""``benchmarks/pub_path.py``: each stage its profile names is on the read path it
drives, so that a stage the path no longer calls is not shown as taking none of it; and
its cold measurement, the anchor and the broker's path taking turns after an eviction;
and its split, each layer of the path timed, then put back as it was."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def pub_path() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO / "benchmarks"))
        yield importlib.import_module("pub_path")


def test_every_stage_is_on_the_profiled_path(pub_path: ModuleType) -> None:
    anchor, full, stats = asyncio.run(pub_path.measure(300, True))
    assert stats is not None and anchor > 0 and full > 0
    shares = pub_path.stage_shares(stats)
    assert set(shares) == set(pub_path.STAGES)
    missing = [stage for stage, share in shares.items() if share is None]
    assert not missing, f"not called on the read path: {missing}"
    assert all(0 < share <= 1 for share in shares.values())
    # The peer's socket calls are the driver's, outside the read callback.
    assert shares["write (OK and send)"] < 1


def test_a_stage_not_called_is_none(pub_path: ModuleType) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    sum(range(10))
    prof.disable()
    assert set(pub_path.stage_shares(pstats.Stats(prof)).values()) == {None}


def test_cold_steps_take_turns_each_after_an_eviction(pub_path: ModuleType) -> None:
    log: list[str] = []
    anchor, full = pub_path._timed_cold(
        (lambda: log.append("anchor"), lambda: log.append("broker")),
        3,
        lambda: log.append("evict"),
    )
    assert log == ["evict", "anchor", "evict", "broker"] * 3
    assert anchor > 0 and full > 0


def test_cold_measure_runs_the_broker_s_path(pub_path: ModuleType) -> None:
    anchor, full, stats = asyncio.run(pub_path.measure(20, False, pub_path.Evictor(1)))
    assert stats is None
    assert anchor > 0 and full > 0


def test_split_times_every_layer_then_puts_it_back(pub_path: ModuleType) -> None:
    originals = [(owner, name, getattr(owner, name)) for _, owner, name in pub_path.LAYERS]
    warm, cold = pub_path.split_layers(20, 10, pub_path.Evictor(1))
    for label, _, _ in pub_path.LAYERS:
        assert warm[label] > 0, label  # nan where the path did not call it
        assert cold[label] > 0, label
    assert all(getattr(owner, name) is fn for owner, name, fn in originals)
