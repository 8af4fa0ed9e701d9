"""Prometheus metrics of every kernel, computed per scrape from one fresh view (a custom ``prometheus_client``
collector that yields ``GaugeMetricFamily`` objects; nothing is cached between scrapes).

Every kernel series carries ``kernel_id`` and ``notebook`` (its session's path, "" without one; cut to 500
characters, and, as ``kernel_name`` and ``queue``, with control and bidi characters written as escapes: a label is
read by people in dashboards and alerts); a few carry one more label with a small, fixed set of values: ``state``
(thread states), ``gpu`` (device index), ``queue`` (at most 16 queues per kernel) or ``status``.

Per-kernel series are for authenticated scrapes. With ``ServerApp.authenticate_prometheus = False`` a scrape without
credentials gets totals over the server's kernels only (as jupyter_server's own ``/metrics``), with no kernel id,
path or queue name (unless ``NBCoordServer.unauthenticated_kernel_labels``): ``nbcoord_kernels{status}``,
``nbcoord_kernels_rss_bytes``, ``nbcoord_kernels_gpu_memory_bytes{gpu}`` (kernels and their workers),
``nbcoord_kernels_worker_processes``, ``nbcoord_kernels_threads{state}``, ``nbcoord_kernels_zombie_threads``,
``nbcoord_kernels_blocked_runs``, ``nbcoord_kernels_thread_failures`` and ``nbcoord_view_seconds``.

No label is per thread, so the number of series grows with kernels, not with threads. Kernels without nbcoord still
have ``nbcoord_kernel_up``, ``nbcoord_kernel_info``, RSS, worker processes and GPU memory: those are read from
outside.

=========================================================  ==========================================================
``nbcoord_kernels{status}``                                kernels by status (ok, no-nbcoord, not-answering, dead,
                                                           error)
``nbcoord_kernel_info{kernel_id,notebook,kernel_name,      1 per kernel; its status as a label
status}``
``nbcoord_kernel_up``                                      1 when the kernel process runs
``nbcoord_kernel_answering``                               1 when nbcoord answered within the server's deadline
``nbcoord_kernel_answer_seconds``                          how long it took to answer
``nbcoord_kernel_rss_bytes``                               the kernel process's resident memory
``nbcoord_kernel_gpu_memory_bytes{gpu}``                   GPU memory the kernel process holds, per device (NVML)
``nbcoord_kernel_worker_gpu_memory_bytes{gpu}``            GPU memory its descendants hold, per device
``nbcoord_kernel_worker_processes``                        descendants of the kernel process
``nbcoord_kernel_threads{state}``                          live threads the cells started, by state (running,
                                                           waiting, stopping)
``nbcoord_kernel_own_threads``                             the kernel's own threads (never stopped)
``nbcoord_kernel_zombie_threads``                          zombie threads
``nbcoord_kernel_tasks``                                   tasks (where this nbcoord tracks them)
``nbcoord_kernel_blocked_runs``                            runs blocked now (a session.run on an empty queue)
``nbcoord_kernel_blocked_seconds``                         the longest of them, seconds
``nbcoord_kernel_queue_fill_ratio{queue}``                 size / capacity of each bounded queue
``nbcoord_kernel_thread_failures``                         thread failures recorded
``nbcoord_kernel_last_stop_timestamp_seconds``             when the last stop began
``nbcoord_kernel_last_stop_alive_threads``                 threads still alive after it
``nbcoord_view_seconds``                                   how long this scrape's view took
=========================================================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from nbcoord.core.schema import THREAD_STATES
from nbcoord.server._model import FleetView, KernelRow
from nbcoord.server._text import NAME_CHARS, TEXT_CHARS, shown

KERNEL_LABELS = ["kernel_id", "notebook"]
STATUSES = ("ok", "no-nbcoord", "not-answering", "dead", "error")


def _gauge(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=[*KERNEL_LABELS, *(extra or [])])


class FleetCollector(Collector):
    """Yields the metric families of one view (made for the scrape that asked for it)."""

    def __init__(self, view: FleetView, *, per_kernel: bool = True) -> None:
        self._view = view
        self._per_kernel = per_kernel

    def describe(self) -> list[Any]:
        """Nothing to describe ahead of a scrape: the families depend on the kernels there are."""
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Every family, computed from the view."""
        rows = self._view["kernels"]
        yield self._by_status(rows)
        if self._per_kernel:
            families = _Families()
            for row in rows:
                families.add(row)
            yield from families.all()
        else:
            yield from _totals(rows)
        took = GaugeMetricFamily("nbcoord_view_seconds", "How long the view of every kernel took for this scrape.")
        took.add_metric([], self._view["took_ms"] / 1000.0)
        yield took

    @staticmethod
    def _by_status(rows: list[KernelRow]) -> GaugeMetricFamily:
        family = GaugeMetricFamily("nbcoord_kernels", "Kernels of this server, by status.", labels=["status"])
        for status in STATUSES:
            family.add_metric([status], sum(1 for row in rows if row["status"] == status))
        return family


class _Families:
    """The per-kernel families, filled one kernel at a time."""

    def __init__(self) -> None:
        self.info = _gauge("nbcoord_kernel_info", "One per kernel; its status and kernel spec as labels.",
                           ["kernel_name", "status"])
        self.up = _gauge("nbcoord_kernel_up", "1 when the kernel process is running.")
        self.answering = _gauge("nbcoord_kernel_answering",
                                "1 when nbcoord in the kernel answered within the server's deadline.")
        self.answer = _gauge("nbcoord_kernel_answer_seconds", "How long nbcoord took to answer.")
        self.rss = _gauge("nbcoord_kernel_rss_bytes", "Resident memory of the kernel process.")
        self.gpu = _gauge("nbcoord_kernel_gpu_memory_bytes", "GPU memory the kernel process holds, per device.",
                          ["gpu"])
        self.worker_gpu = _gauge("nbcoord_kernel_worker_gpu_memory_bytes",
                                 "GPU memory the kernel's descendant processes hold, per device.", ["gpu"])
        self.workers = _gauge("nbcoord_kernel_worker_processes", "Descendant processes of the kernel process.")
        self.threads = _gauge("nbcoord_kernel_threads", "Live threads started by cells, by state.", ["state"])
        self.own = _gauge("nbcoord_kernel_own_threads", "The kernel's own threads (never stopped by nbcoord).")
        self.zombies = _gauge("nbcoord_kernel_zombie_threads",
                              "Zombie threads: their cell failed or was interrupted, they ignored a stop, or their "
                              "owner is closed.")
        self.tasks = _gauge("nbcoord_kernel_tasks", "Tasks the kernel's cells left running.")
        self.blocked = _gauge("nbcoord_kernel_blocked_runs", "Runs blocked now (e.g. a session run on an empty queue).")
        self.blocked_s = _gauge("nbcoord_kernel_blocked_seconds", "The longest blocked run, seconds.")
        self.fill = _gauge("nbcoord_kernel_queue_fill_ratio", "Size over capacity of a bounded queue.", ["queue"])
        self.failures = _gauge("nbcoord_kernel_thread_failures", "Thread failures recorded by nbcoord.")
        self.stop_at = _gauge("nbcoord_kernel_last_stop_timestamp_seconds", "When the kernel's last stop began.")
        self.stop_alive = _gauge("nbcoord_kernel_last_stop_alive_threads",
                                 "Threads still alive after the kernel's last stop.")

    def add(self, row: KernelRow) -> None:
        key = [shown(row["id"], NAME_CHARS), shown(row["path"] or "", TEXT_CHARS)]
        self.info.add_metric([*key, shown(row["name"], NAME_CHARS), row["status"]], 1)
        self.up.add_metric(key, 0 if row["status"] == "dead" else 1)
        self.answering.add_metric(key, 1 if row["status"] == "ok" else 0)
        if row["answer_ms"] is not None:
            self.answer.add_metric(key, row["answer_ms"] / 1000.0)
        if row["rss"] is not None:
            self.rss.add_metric(key, row["rss"])
        for held in row["gpu"]:
            self.gpu.add_metric([*key, str(held["index"])], held["bytes"])
            self.worker_gpu.add_metric([*key, str(held["index"])], held["workers_bytes"])
        if row["worker_processes"] is not None:
            self.workers.add_metric(key, row["worker_processes"])
        summary = row["nbcoord"]
        if summary is None:
            return
        for state in THREAD_STATES:
            self.threads.add_metric([*key, state], summary["threads_by_state"].get(state, 0))
        self.own.add_metric(key, summary["kernel_threads"])
        self.zombies.add_metric(key, summary["zombies"])
        if summary["tasks"] is not None:
            self.tasks.add_metric(key, summary["tasks"])
        self.blocked.add_metric(key, summary["blocked_runs"])
        self.blocked_s.add_metric(key, summary["blocked_seconds"])
        for queue in summary["queues"]:
            if queue["fill"] is not None:
                self.fill.add_metric([*key, shown(queue["name"], NAME_CHARS)], queue["fill"])
        self.failures.add_metric(key, summary["failures"])
        last = summary["last_stop"]
        if last is not None:
            self.stop_at.add_metric(key, last["started_at"])
            self.stop_alive.add_metric(key, last["alive"])

    def all(self) -> Iterator[GaugeMetricFamily]:
        yield from vars(self).values()


def _totals(rows: list[KernelRow]) -> Iterator[GaugeMetricFamily]:
    """Sums over the kernels, without a label that names a kernel, a notebook or a queue (open metrics)."""
    rss = GaugeMetricFamily("nbcoord_kernels_rss_bytes", "Resident memory of the kernel processes, summed.")
    rss.add_metric([], sum(row["rss"] or 0 for row in rows))
    gpu_bytes: dict[int, int] = {}
    for row in rows:
        for held in row["gpu"]:
            gpu_bytes[held["index"]] = gpu_bytes.get(held["index"], 0) + held["bytes"] + held["workers_bytes"]
    gpu = GaugeMetricFamily("nbcoord_kernels_gpu_memory_bytes",
                            "GPU memory the kernels and their descendants hold, per device, summed.", labels=["gpu"])
    for index in sorted(gpu_bytes):
        gpu.add_metric([str(index)], gpu_bytes[index])
    workers = GaugeMetricFamily("nbcoord_kernels_worker_processes", "Descendant processes of the kernels, summed.")
    workers.add_metric([], sum(row["worker_processes"] or 0 for row in rows))
    summaries = [row["nbcoord"] for row in rows if row["nbcoord"] is not None]
    threads = GaugeMetricFamily("nbcoord_kernels_threads", "Live threads started by cells, by state, summed.",
                                labels=["state"])
    for state in THREAD_STATES:
        threads.add_metric([state], sum(s["threads_by_state"].get(state, 0) for s in summaries))
    yield from (rss, gpu, workers, threads)
    for name, total, doc in (
        ("nbcoord_kernels_zombie_threads", sum(s["zombies"] for s in summaries), "Zombie threads in the kernels."),
        ("nbcoord_kernels_blocked_runs", sum(s["blocked_runs"] for s in summaries), "Runs blocked now in the kernels."),
        ("nbcoord_kernels_thread_failures", sum(s["failures"] for s in summaries), "Thread failures in the kernels."),
    ):
        family = GaugeMetricFamily(name, f"{doc[:-1]}, summed.")
        family.add_metric([], total)
        yield family
