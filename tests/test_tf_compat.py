"""TensorFlow's own threads are never called zombies, nor failed threads (part 7), on real TensorFlow (CPU build).

``tf.distribute.MirroredStrategy`` over two logical CPU devices runs a Coordinator and replica threads of its own;
``tf.data`` with ``from_generator`` runs Python on TensorFlow's threads; Keras ``fit`` with a ``PyDataset`` that
uses workers starts an enqueuer thread and a thread pool. After each finishes, nothing of theirs is left running
or called a zombie; a replica's exception, which MirroredStrategy re-raises in the cell, is not reported again
as a failed thread; an interrupted ``fit`` leaves threads that are listed with the cell that started them.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from helpers import Kernel, marked_json, wait_until
from tf_support import collect_interrupted, tf_kernel_params

pytestmark = [pytest.mark.kernel, pytest.mark.tensorflow]


def user_threads(kernel: Kernel) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = kernel.evaluate(
        "[{k: t[k] for k in ('name', 'cell', 'zombie')} for t in nbcoord.snapshot()['threads'] "
        "if t['user'] and t['alive']]"
    )
    return rows


#: The module's kernel (conftest's ``kernel``), one per TensorFlow release: two logical CPUs for the strategies.
KERNEL_OPTIONS = tf_kernel_params(
    after="""
    import json, threading, time
    import numpy as np
    import nbcoord
    import tensorflow as tf
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    """
)


def test_mirrored_strategy_and_from_generator_leave_nothing_behind(kernel: Kernel) -> None:
    result = kernel.run(
        textwrap.dedent("""
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            weight = tf.Variable(1.0)
        out = strategy.run(lambda x: x * weight, args=(tf.constant(2.0),))
        def numbers():
            for i in range(100):
                yield np.float32(i)
        data = tf.data.Dataset.from_generator(numbers, output_signature=tf.TensorSpec([], tf.float32)).batch(10)
        total = sum(float(tf.reduce_sum(batch)) for batch in data)
        print("@@" + json.dumps([strategy.num_replicas_in_sync,
                                 [float(x) for x in strategy.experimental_local_results(out)], total]))
        """),
    )
    assert marked_json(result) == [2, [2.0, 2.0], 4950.0]
    wait_until(lambda: user_threads(kernel) == [], 10, what="MirroredStrategy's threads to end")
    assert kernel.evaluate("nbcoord.snapshot()['zombie_count']") == 0
    failed = kernel.run(
        textwrap.dedent("""
        def bad(x):
            raise ValueError("replica failed")
        strategy.run(bad, args=(tf.constant(2.0),))
        """),
        allow_error=True,
    )
    assert failed.errors and failed.errors[0]["ename"] == "ValueError", "MirroredStrategy raises it in the cell"
    after = kernel.run("print('next')")
    assert "failed" not in after.stderr, f"reported a second time as a thread failure: {after.stderr}"
    wait_until(lambda: user_threads(kernel) == [], 10, what="the replica threads to end")


@pytest.fixture(scope="module")
def keras_kernel(kernel: Kernel) -> Kernel:
    """The kernel once Keras, a dataset of batches with two worker threads and a small model are defined (each
    test that fits one asks for this, so that it runs alone too: ``-k`` selects it without the others)."""
    kernel.run(
        textwrap.dedent("""
        import keras
        if hasattr(keras.utils, "PyDataset"):  # Keras 3: the dataset holds its workers
            Base, DATA, FIT = keras.utils.PyDataset, dict(workers=2, use_multiprocessing=False), {}
        else:  # Keras 2 (TensorFlow 2.15): a Sequence, and the workers are fit()'s
            Base, DATA, FIT = keras.utils.Sequence, {}, dict(workers=2, use_multiprocessing=False)
        class Batches(Base):
            def __init__(self, size, delay, **kwargs):
                super().__init__(**kwargs)
                self.size, self.delay = size, delay
            def __len__(self):
                return self.size
            def __getitem__(self, index):
                time.sleep(self.delay)
                return np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        """),
    )
    return kernel


def test_keras_fit_with_pydataset_workers_leaves_nothing_behind(keras_kernel: Kernel) -> None:
    kernel = keras_kernel
    kernel.run("model.fit(Batches(20, 0.0, **DATA), epochs=2, verbose=0, **FIT)")
    wait_until(lambda: user_threads(kernel) == [], 10, what="fit's threads to end")
    assert kernel.evaluate("nbcoord.snapshot()['zombie_count']") == 0


def test_an_interrupted_fit_leaves_only_threads_listed_with_its_cell(keras_kernel: Kernel) -> None:
    kernel = keras_kernel
    # Keras 2 used to lose this Interrupt: its previous fit's enqueuer was finalized (SequenceEnqueuer.__del__) in
    # the main thread during the next fit, swallowing the KeyboardInterrupt, because nbcoord's monitor held every
    # thread's frames while it sampled. The monitor now keeps (code, line) only.
    fit = kernel.submit(
        textwrap.dedent(
            """
            class UnderWay(keras.callbacks.Callback):
                def on_train_batch_begin(self, batch, logs=None):
                    if batch == 3:
                        print("fit under way", flush=True)
            model.fit(Batches(1000, 0.05, **DATA), epochs=5, verbose=0, callbacks=[UnderWay()], **FIT)
            """
        )
    )

    def under_way() -> bool:
        kernel._drain_iopub(fit, 0.05)
        return "fit under way" in kernel._iopub[fit].stdout

    wait_until(under_way, 60, what="fit to be under way, its workers busy")
    kernel.interrupt()
    result = collect_interrupted(kernel, fit)
    assert result.errors and result.errors[0]["ename"] == "KeyboardInterrupt"
    cell = kernel.evaluate("len(In) - 2")
    left = user_threads(kernel)
    assert all(row["cell"] == cell and row["zombie"] == "cell-interrupted" for row in left), left
    # Keras 3's workers are a multiprocessing ThreadPool: the ledger lists it too, as one other item of the cell.
    items = kernel.evaluate(
        f"[r['label'] for r in nbcoord.snapshot()['ledger'] if r['cell'] == {cell} and r['zombie'] is not None "
        "and r['kind'] != 'process']"
    )
    if left:
        counts = f"{len(left)} thread(s)" + (f" and {len(items)} other item(s)" if items else "")
        assert f"cell [{cell}] was interrupted and left {counts} running" in result.stderr
    print("left by the interrupted fit:", [row["name"] for row in left], items)
