"""A run nbcoord cancels ends with a traceback that stops at the user's call (nbcoord.tensorflow.tracebacks).

Real kernels on each TensorFlow release (tf_support.TF_KERNELS): the traceback of an interrupted blocked run shows
the cell's and the user's frames, not nbcoord's wrapper; every other KeyboardInterrupt is shown as IPython shows it
without nbcoord; IPython's one custom-exception slot is taken only while free and given back at unload.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from helpers import Kernel
from tf_support import collect_interrupted, submit_blocked, tf_kernel_params

KERNEL_OPTIONS = tf_kernel_params(
    after="""
    import json, threading, time
    import nbcoord
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    """
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: A KeyboardInterrupt of the user's own, raised two frames down.
USERS_OWN = """
def _inner():
    raise KeyboardInterrupt("the user's own")
def _outer():
    _inner()
_outer()
"""


def traceback_text(kernel: Kernel, msg_id: str) -> str:
    result = collect_interrupted(kernel, msg_id)
    assert result.errors and result.errors[0]["ename"] == "KeyboardInterrupt", result.errors
    return ANSI.sub("", "\n".join(result.errors[0]["traceback"]))


def frames_of(text: str) -> list[str]:
    """The frame headers of a formatted traceback ("Cell In[4], line 3", "File ...:205, in run(...)")."""
    return [line for line in text.splitlines() if line.startswith(("Cell In[", "File "))]


def test_a_cancelled_runs_traceback_ends_at_the_users_call(kernel: Kernel, tmp_path: Path) -> None:
    kernel.run(
        textwrap.dedent("""
        q = tf.compat.v1.FIFOQueue(10, tf.float32, name="unfed")
        deq = q.dequeue()
        sess = tf.compat.v1.Session()
        def next_batch():
            return sess.run(deq)
        """)
    )
    assert kernel.evaluate("get_ipython().custom_exceptions == (KeyboardInterrupt,)")
    cell, _rows = submit_blocked(kernel, tmp_path, "next_batch()")
    kernel.interrupt()
    text = traceback_text(kernel, cell)
    frames = frames_of(text)
    assert len(frames) == 2 and "in next_batch()" in frames[-1], text  # the cell, then the user's function
    assert re.search(r"----> +\d+ +return sess\.run\(deq\)", text), text
    assert "nbcoord/" not in text and "tensorflow/python" not in text, text
    assert "nbcoord cancelled the session run" in text, text


def test_other_interrupts_are_shown_as_without_nbcoord_and_unload_gives_the_slot_back(own_kernel: Kernel) -> None:
    kernel = own_kernel
    with_nbcoord = traceback_text(kernel, kernel.submit(USERS_OWN))
    kernel.run("%unload_ext nbcoord")
    assert kernel.evaluate("get_ipython().custom_exceptions") == []  # () in JSON
    without = traceback_text(kernel, kernel.submit(USERS_OWN))
    cell_numbers = re.compile(r"In\[\d+\]")
    assert cell_numbers.sub("In[n]", with_nbcoord) == cell_numbers.sub("In[n]", without)
    assert len(frames_of(with_nbcoord)) == 3, with_nbcoord


def test_a_users_own_custom_exception_handler_is_kept(own_kernel: Kernel) -> None:
    """The slot is the user's: nbcoord leaves it, says so in what fell back, and unload leaves it too."""
    kernel = own_kernel
    kernel.run("%unload_ext nbcoord")
    kernel.run(
        textwrap.dedent("""
        def _mine(shell, etype, value, tb, tb_offset=None):
            print("handled by the user's handler")
        get_ipython().set_custom_exc((ValueError,), _mine)
        """)
    )
    kernel.run("%load_ext nbcoord")  # TensorFlow is imported: its integration installs with the load
    assert kernel.evaluate("get_ipython().custom_exceptions == (ValueError,)")
    assert "InteractiveShell.set_custom_exc" in kernel.evaluate("list(nbcoord._extension.degraded())")
    assert "handled by the user's handler" in kernel.run("raise ValueError('x')", allow_error=True).stdout
    kernel.run("%unload_ext nbcoord")
    assert kernel.evaluate("get_ipython().custom_exceptions == (ValueError,)")
