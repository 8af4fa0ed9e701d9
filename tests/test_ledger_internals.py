"""The private names the ledger's kinds read for their labels and their threads' owners (nbcoord/ledger/internals.py),
each removed from a real object of its library (``monkeypatch``): the accessor does what its docstring names
instead, and the one record of what fell back (nbcoord/core/fallbacks.py) says so. The other accessors' fallbacks
are tested in tests/test_ledger_units.py.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace

import pytest

from nbcoord.core.fallbacks import Fallbacks
from nbcoord.ledger import internals

FORK = multiprocessing.get_context("fork")


def installed(name: str) -> bool:
    return name in sys.modules or importlib.util.find_spec(name) is not None


@pytest.fixture(autouse=True)
def fresh_degraded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internals, "_fallbacks", Fallbacks())


def test_executor_max_workers_and_its_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    executor = ProcessPoolExecutor(max_workers=3, mp_context=FORK)  # no worker starts before the first submit
    try:
        assert internals.executor_max_workers(executor) == 3
        assert internals.degraded() == {}
        monkeypatch.delattr(executor, "_max_workers")
        assert internals.executor_max_workers(executor) is None
    finally:
        executor.shutdown()
    assert internals.degraded() == {
        "ProcessPoolExecutor._max_workers": "an executor's label names no number of workers"
    }


def test_executor_feeder_threads_and_their_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    with ProcessPoolExecutor(max_workers=1, mp_context=FORK) as executor:
        assert executor.submit(int, "7").result(timeout=30) == 7
        feeders = internals.executor_feeder_threads(executor)
        assert len(feeders) == 1 and feeders[0].is_alive()
        assert internals.degraded() == {}
    assert internals.executor_feeder_threads(executor) == []  # shut down: its queue is gone, nothing fell back
    assert internals.degraded() == {}
    monkeypatch.delattr(executor, "_call_queue")
    assert internals.executor_feeder_threads(executor) == []
    assert internals.degraded() == {
        "ProcessPoolExecutor._call_queue": "an executor's queue feeder thread is listed without its owner"
    }


@pytest.mark.skipif(not installed("joblib"), reason="joblib is not installed")
def test_loky_reusable_names_joblibs_and_lokys_executors_and_nothing_else() -> None:
    from joblib.executor import MemmappingExecutor
    from joblib.externals.loky.process_executor import ProcessPoolExecutor as LokyExecutor
    from joblib.externals.loky.reusable_executor import _ReusablePoolExecutor

    assert internals.loky_reusable(_ReusablePoolExecutor) and internals.loky_reusable(MemmappingExecutor)
    assert not internals.loky_reusable(LokyExecutor) and not internals.loky_reusable(ProcessPoolExecutor)
    # The fallback of a renamed class: it is labelled by its own name, and nothing is missing to record.
    assert not internals.loky_reusable(type("ReusablePoolExecutor", (LokyExecutor,), {}))
    assert internals.degraded() == {}


@pytest.mark.skipif(not installed("torch"), reason="PyTorch is not installed")
def test_loader_feeder_threads_and_their_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.data import DataLoader

    iterator = iter(DataLoader(list(range(8)), num_workers=2))
    queues = {name: getattr(iterator, name) for name in ("_index_queues", "_worker_result_queue")}
    try:
        assert next(iterator).tolist() == [0]  # the index queues have been fed: their feeder threads run
        feeders = internals.loader_feeder_threads(iterator)
        assert len(feeders) >= 2 and all(thread.is_alive() for thread in feeders)
        assert internals.degraded() == {}
        for name in queues:
            monkeypatch.delattr(iterator, name)
        assert internals.loader_feeder_threads(iterator) == []
    finally:
        for name, queue in queues.items():
            setattr(iterator, name, queue)  # PyTorch's own shutdown needs them
        internals.loader_shutdown_method(iterator)()
    assert set(internals.degraded()) == {"_MultiProcessingDataLoaderIter._index_queues / _worker_result_queue"}


def test_loader_feeder_threads_of_one_missing_queue_list_the_other(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = FORK.Queue()
    queue.put(1)
    assert queue.get(timeout=10) == 1
    iterator = SimpleNamespace(_index_queues=[queue])  # no _worker_result_queue
    try:
        assert len(internals.loader_feeder_threads(iterator)) == 1
    finally:
        queue.close()
        queue.join_thread()
    assert "_MultiProcessingDataLoaderIter._index_queues / _worker_result_queue" in internals.degraded()
