"""Background output goes home: what a thread writes appears under the cell that started it.

Without nbcoord, text that a background thread writes to ``sys.stdout`` / ``sys.stderr`` (``print``, a warning,
a logging handler on the kernel's streams) carries the parent header of whichever request the kernel handles
last, so it lands under the cell running now, or under the last one run. With nbcoord loaded:

- while the cell that started the thread still runs, nothing changes (the text is that cell's output anyway);
- once that cell has finished, the text goes into one output area that nbcoord adds to that cell: a
  ``display_data`` message with a ``display_id``, sent with the starting cell's own request as its parent, and
  then updated in place with ``update_display_data``. The cell that runs meanwhile stays clean;
- a thread's uncaught exception (its traceback text) goes there too; nbcoord's one-line notice in the next cell
  and ``%nbcoord`` keep it as before;
- bounded: each area keeps the last ``NBCoord.output_lines`` lines (200), counts the others and says so in its
  first line; a line longer than 2,000 characters is cut; an area is updated at most 4 times a second, however
  fast a thread writes (``\\r`` progress bars rewrite their line rather than adding lines);
- a cell run again moves its area to the new run (the old output is gone; its first line names the earlier run);
- ``NBCoord.route_output = False`` (``%nbcoord config route_output=false``) leaves thread output to the kernel.
Why this route. JupyterLab 4 and Notebook 7 (both use ``@jupyterlab/outputarea``) run a cell with
``kernel.requestExecute(content, disposeOnDone=false)``: the cell's future stays registered with the page's kernel
connection until the cell runs again, so a ``display_data`` whose parent is a finished request still reaches that
cell's output area, and a later ``update_display_data`` is matched by its ``display_id``
(``KernelConnection._handleDisplayId``) and never shown under the cell that runs. What is lost: output for a
finished cell that a page reloaded after it ran (its futures are gone; the text stays in ``%nbcoord``), and
in unattended runs (nbclient, nbconvert, papermill listen to a request only while it runs).

Where the kernel routes a thread's text itself, nbcoord leaves it alone: ipykernel 6.x sends a cell's threads' text
with that cell's header (unbounded, the whole stream), and on both lines a thread can set its own parent
(``set_parent``, ``set_thread_parent``). A thread whose stream header is not the kernel's latest request is the
kernel's to route, from then on (also after it resets its parent); ipykernel 7.1+ otherwise sends a thread's text
under the latest request, which is what nbcoord moves.

How. The kernel's two ``OutStream`` objects get nbcoord's ``write`` in front of their own (the objects, their
class and ``sys.stdout`` stay as they are; IPython 9's per-cell wrapper, which keeps a cell's output in its history,
stays in front of it: see ``ipython_tee_cell``); unload puts the kernel's own back. On the main thread it costs one
comparison; in a thread, the thread's home cell is looked up once and kept in a thread-local. Sending happens in the
writing thread when an update is due (one thread sends at a time), and nbcoord's monitor thread sends what is left
about once a second. ``threading.excepthook`` is chained above nbcoord's own hook (which keeps the failure as text
and stops Python's default print into the running cell).

Not covered: text written by native code straight to file descriptors 1 and 2 (TensorFlow's C++ log lines, a
subprocess inheriting them): ipykernel reads those from a pipe in a thread of its own and nothing says which
thread wrote them, so they stay with the kernel's routing. asyncio tasks already carry their cell's header in
their context on both ipykernel lines. In a forked child, every part of this module passes straight through.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcoord.core import fork as _fork
from nbcoord.core.internals import ipython_tee_cell
from nbcoord.core.records import CellInfo
from nbcoord.core.stop import ThreadStopped
from nbcoord.kernel.output_areas import Area, Run, Writer

if TYPE_CHECKING:
    from nbcoord.core.host import Host

log = logging.getLogger("nbcoord")

#: Lines kept per cell when the setting ``output_lines`` is absent.
DEFAULT_LINES = 200
#: Seconds between two updates of one area: a thread printing in a tight loop costs the browser 4 updates a second.
UPDATE_INTERVAL_S = 0.25
#: Seconds between any two sends, over all areas.
MIN_SEND_GAP_S = 0.02
#: Areas kept; beyond it the least recently written is forgotten (its text stays in the browser).
MAX_AREAS = 200
#: Runs of cells remembered (their request headers), for cells whose threads have not written yet.
MAX_RUNS = 2000
#: Where the routed text is displayed: the MIME type of the output area.
MIME = "text/plain"

def _header_of(parent: Any) -> dict[str, Any] | None:
    """The request header in what ``shell.parent_header`` holds (the whole request message on ipykernel 6 and 7)."""
    if not isinstance(parent, dict):
        return None
    header = parent.get("header", parent)
    return header if isinstance(header, dict) and header.get("msg_id") else None


class OutputRouter:
    """Routes the background output of one loaded extension (see the module docstring). ``install`` adds: an instance
    ``write`` on each of the kernel's two streams, a chained ``threading.excepthook``, a cell listener (the request
    header of every run), a monitor task (what is left to send), a snapshot source (section ``outputs``), a
    fork-child action and, when the settings exist, observers of ``route_output`` and ``output_lines``. ``uninstall``
    removes exactly those, after sending what is left."""

    def __init__(self, host: Host) -> None:
        self._host = host
        self._shell = host.shell
        self._registry = host.registry
        self._config = host.config
        # Guards _areas and _runs (read without it on the write path: single dict lookups).
        self._lock = threading.Lock()
        self._areas: dict[str, Area] = {}
        self._runs: dict[str, Run] = {}
        self._local = threading.local()
        self._undo: list[Callable[[], None]] = []
        self._original_stderr: Callable[[str], Any] | None = None
        self._publish: Callable[[str, dict[str, Any], dict[str, Any] | None], None] | None = None
        #: The kernel's latest shell request, whatever the calling thread set (ipykernel's public
        #: ``Kernel.get_parent("shell")``, 6.0+); None: not a kernel, and no thread's parent is judged.
        self._latest_request: Callable[[str], Any] | None = getattr(getattr(self._shell, "kernel", None),
                                                                    "get_parent", None)
        self._display_ids = itertools.count(1)
        self._last_send = -1e9
        self._logged: set[str] = set()
        #: Installed, in the process that loaded nbcoord, routes in place: the write path's one flag besides the
        #: setting (plain attributes: read on every write).
        self._active = False
        self._enabled = True
        self._routing = False
        #: Why routing is not in place here, if it is not.
        self.unavailable: str | None = None

    @property
    def routing(self) -> bool:
        """Whether thread output is routed now: installed, in the process that loaded nbcoord, the setting on."""
        return self._routing

    # ----------------------------------------------------------------------------------------- install
    def install(self) -> None:
        """Install the route (see the class docstring); where the kernel's streams are not ipykernel's, say why in
        the extension's degraded routes and route nothing."""
        reason = self._find_route()
        if reason is not None:
            self.unavailable = reason
            self._host.degraded_routes["output routing"] = reason

            def forget() -> None:
                self._host.degraded_routes.pop("output routing", None)

            self._undo.append(forget)
            log.info("nbcoord: background output is not routed: %s", reason)
            return
        self._enabled = bool(getattr(self._config, "route_output", True))
        self._observe_settings()
        self._remember_loading_cell()
        self._undo.append(self._host.add_cell_listener("output", self._on_cell))
        self._undo.append(self._host.monitor.add_task("output", self.flush))
        self._undo.append(self._host.snapshots.add_source("outputs", self.section))
        self._undo.append(_fork.on_fork_child(self._forget_in_child))
        self._install_excepthook()
        for name in ("stdout", "stderr"):
            self._wrap(name)
        self._active = True
        self._update_routing()

    def uninstall(self) -> None:
        """Remove everything :meth:`install` added, after sending what is left to send; never raises."""
        self._active = False
        self._update_routing()
        try:
            self.flush()
        except Exception:
            log.warning("nbcoord: the last output update failed", exc_info=True)
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                log.warning("nbcoord: removing part of the output route failed", exc_info=True)

    def _find_route(self) -> str | None:
        """None when the kernel's streams and display publisher are ipykernel's; else why not."""
        iostream = sys.modules.get("ipykernel.iostream")
        out_stream = getattr(iostream, "OutStream", None)
        if out_stream is None or not all(isinstance(s, out_stream) for s in (sys.stdout, sys.stderr)):
            return "sys.stdout and sys.stderr are not ipykernel's streams (not a Jupyter kernel)"
        display_pub = getattr(self._shell, "display_pub", None)
        session = getattr(display_pub, "session", None)
        socket = getattr(display_pub, "pub_socket", None)
        if session is None or socket is None or not hasattr(session, "send"):
            return "the shell's display publisher has no session to send with"

        def publish(msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None) -> None:
            session.send(socket, msg_type, content, parent=parent, ident=b"display_data")

        self._publish = publish
        return None

    def _wrap(self, name: str) -> None:
        """Put the router's ``write`` under the stream's ``write`` (see ``ipython_tee_cell``), or make it the stream's
        ``write`` where nothing wraps it."""
        stream = getattr(sys, name)
        cell = ipython_tee_cell(stream.__dict__.get("write"), lambda _found: True)
        had_own = "write" in stream.__dict__
        original: Callable[..., Any] = cell.cell_contents if cell is not None else stream.write
        router = self
        main_ident = threading.main_thread().ident
        get_ident = threading.get_ident

        def write(text: str, *args: Any, **kwargs: Any) -> Any:
            if router._routing and get_ident() != main_ident:
                try:
                    if router._route(text, stream):
                        return len(text)
                except Exception:
                    router._log_once("write", "nbcoord: routing a thread's output failed; it goes to the kernel")
            return original(text, *args, **kwargs)

        write.__doc__ = original.__doc__
        if cell is not None:
            cell.cell_contents = write  # IPython restores this at the cell's end: ours from then on
        else:
            stream.write = write
        if name == "stderr":
            self._original_stderr = original

        def restore() -> None:
            inside = ipython_tee_cell(stream.__dict__.get("write"), lambda found: found is write)
            if inside is not None:
                inside.cell_contents = original  # unloaded inside a cell: IPython restores the kernel's own
            elif stream.__dict__.get("write") is write:
                if had_own:
                    stream.write = original
                else:
                    del stream.__dict__["write"]
            else:
                log.warning("nbcoord: sys.%s.write was replaced after nbcoord; leaving it, nbcoord's part is off", name)

        self._undo.append(restore)

    def _install_excepthook(self) -> None:
        previous = threading.excepthook
        router = self

        def excepthook(args: Any) -> object:
            if router._routing:
                try:
                    router._route_failure(args)
                except Exception:
                    router._log_once("excepthook", "nbcoord: routing a thread's traceback failed")
            return previous(args)

        threading.excepthook = excepthook

        def restore() -> None:
            if threading.excepthook is excepthook:
                threading.excepthook = previous
            else:
                log.warning("nbcoord: threading.excepthook was replaced after nbcoord's output route; leaving it")

        self._undo.append(restore)

    def _observe_settings(self) -> None:
        config = self._config
        has_trait = getattr(config, "has_trait", None)
        if has_trait is None:
            return
        if has_trait("route_output"):

            def on_route(change: dict[str, Any]) -> None:
                self._enabled = bool(change["new"])
                self._update_routing()

            config.observe(on_route, names=["route_output"])
            self._undo.append(lambda: config.unobserve(on_route, names=["route_output"]))
        if has_trait("output_lines"):

            def on_lines(change: dict[str, Any]) -> None:
                for area in self._areas_now():
                    area.resize(int(change["new"]))

            config.observe(on_lines, names=["output_lines"])
            self._undo.append(lambda: config.unobserve(on_lines, names=["output_lines"]))

    def _update_routing(self) -> None:
        self._routing = self._active and self._enabled

    def _forget_in_child(self) -> None:
        """In a forked child: everything passes straight through (no lock taken)."""
        self._active = False
        self._routing = False

    def _keep(self) -> int:
        return int(getattr(self._config, "output_lines", DEFAULT_LINES))

    # ------------------------------------------------------------------------------------------- cells
    @staticmethod
    def _key(cell: CellInfo) -> str:
        # Runs of one notebook cell share its id; a request without one is its own cell.
        return cell.cell_id or f"#{id(cell)}"

    def _remember_loading_cell(self) -> None:
        cell = self._registry.current_cell()
        if cell is not None:
            self._note_run(cell, _header_of(getattr(self._shell, "parent_header", None)))

    def _on_cell(self, event: str, cell: CellInfo) -> None:
        """A cell starts: remember its request header (where its threads' output goes), and move the area of an
        earlier run of the same cell to this run. On the main thread, about 1 us.

        A cell ends: areas with text not yet sent go out now, before the cell's reply, so that a front end (or a
        test's collector) that listens until the cell is idle has them under this request, not a second later,
        when the monitor sends what is left, under whichever request comes next."""
        if event == "started" and self._active:
            self._note_run(cell, _header_of(self._shell.parent_header))
        elif event == "finished" and self._active and self._areas:
            for area in self._areas_now():
                if area.version != area.sent_version:
                    self._send(area, blocking=False)  # a thread sending it now sends it; the monitor, the rest

    def _note_run(self, cell: CellInfo, header: dict[str, Any] | None) -> None:
        key = self._key(cell)
        run = Run(cell, header)
        with self._lock:
            self._runs.pop(key, None)  # re-inserted last: the dict stays ordered by the latest run
            self._runs[key] = run
            if len(self._runs) > MAX_RUNS:
                for old in list(self._runs)[: len(self._runs) - MAX_RUNS]:
                    if old not in self._areas:
                        del self._runs[old]
            area = self._areas.get(key)
        if area is not None and area.run.cell is not cell:
            area.move_to(run)

    # ------------------------------------------------------------------------------------------ writes
    def _writer(self) -> Writer | None:
        """The calling thread's home, looked up once per thread: None for threads no cell started."""
        local = self._local
        try:
            writer: Writer | None = local.writer
        except AttributeError:
            record = self._registry.for_thread(threading.current_thread())
            if record is None or not record.user or record.cell is None:
                writer = None
            else:
                writer = Writer(self._key(record.cell), record.cell, record)
            local.writer = writer
        return writer

    def _route(self, text: str, stream: Any, *, failed: bool = False) -> bool:
        """Take ``text`` from the calling thread into its cell's area; False when it is not ours to route (not a
        cell's thread, its cell still runs, the kernel routes this thread itself, not a str)."""
        if not isinstance(text, str):
            return False
        writer = self._writer()
        if writer is None or writer.kernel_routes:
            return False
        latest = self._latest_msg_id()
        if self._kernel_routes(stream, latest):
            writer.kernel_routes = True
            return False
        if writer.home is self._registry.current_cell():
            return False
        run = self._runs.get(writer.key)
        if latest is not None and run is not None and run.header is not None and run.header.get("msg_id") == latest:
            # No request came since the home cell's: the kernel sends the text under that cell anyway (a print's
            # newline, written a moment after its text, just after the cell ended, stays with its text).
            return False
        area = self._areas.get(writer.key)
        if area is None:
            area = self._new_area(writer)
        area.write(writer, text, failed=failed)
        now = time.monotonic()
        if now - area.sent_at >= UPDATE_INTERVAL_S and now - self._last_send >= MIN_SEND_GAP_S:
            self._send(area, blocking=False)
        return True

    def _latest_msg_id(self) -> str | None:
        """The id of the kernel's latest shell request, whatever the calling thread set: ipykernel's public
        ``Kernel.get_parent("shell")`` (the shell's own ``parent_header`` is the calling thread's on ipykernel 7.4);
        None outside a kernel."""
        latest_request = self._latest_request
        latest = _header_of(latest_request("shell")) if latest_request is not None else None
        msg_id = latest.get("msg_id") if latest is not None else None
        return msg_id if isinstance(msg_id, str) else None

    @staticmethod
    def _kernel_routes(stream: Any, latest: str | None) -> bool:
        """Whether ``stream`` sends the calling thread's text with a parent of the kernel's choosing or the thread's
        own, rather than the latest request's (``latest``): ipykernel 6 gives a cell's threads that cell's header,
        and ``set_parent``/``set_thread_parent`` give a thread one on every line. Either way that text already goes
        where its owner meant it to, and nbcoord must not move it (ipykernel's own tests check exactly that).
        Read through ipykernel's public ``OutStream.parent_header`` (the calling thread's, else the latest's)."""
        header = getattr(stream, "parent_header", None)
        if latest is None or not isinstance(header, dict) or not header:
            return False
        return header.get("msg_id") != latest

    def _new_area(self, writer: Writer) -> Area:
        with self._lock:
            area = self._areas.get(writer.key)
            if area is not None:
                return area
            run = self._runs.get(writer.key) or Run(writer.home, None)
            area = self._areas[writer.key] = Area(writer.key, run, self._keep())
            if len(self._areas) > MAX_AREAS:
                oldest = min(self._areas.values(), key=lambda a: a.sent_at)
                del self._areas[oldest.key]
            return area

    def _route_failure(self, args: Any) -> None:
        """An exception escaped a thread: its traceback text goes where the thread's output goes."""
        exc_type = args.exc_type
        thread = args.thread
        if (
            exc_type is None
            or issubclass(exc_type, (SystemExit, ThreadStopped))
            or thread is None
            or thread is not threading.current_thread()
        ):
            return
        writer = self._writer()
        if writer is None:
            return  # not a cell's thread: nbcoord's own hook and Python's decide, as before
        text = f"Exception in thread {thread.name}:\n" + "".join(
            traceback.format_exception(exc_type, args.exc_value, args.exc_traceback)
        )
        if not self._route(text, sys.stderr, failed=True) and self._original_stderr is not None:
            # Its cell still runs: the traceback belongs there, where Python's own hook would have printed it.
            self._original_stderr(text)

    # ------------------------------------------------------------------------------------------ sending
    def flush(self) -> bool:
        """Send every area with text not yet sent (the monitor's task: the end of a burst within a second); whether
        one had some (a burst may go on: the monitor keeps its base interval)."""
        pending = [area for area in self._areas_now() if area.version != area.sent_version]
        for area in pending:
            self._send(area, blocking=True)
        return bool(pending)

    def _areas_now(self) -> list[Area]:
        with self._lock:
            return list(self._areas.values())

    def _send(self, area: Area, *, blocking: bool) -> None:
        if not area.send_lock.acquire(blocking, timeout=1.0 if blocking else -1):
            return  # another thread sends it now
        try:
            now = time.monotonic()
            with area.lock:
                version = area.version
                text = area.render()
                run = area.run
                display_id = area.display_id
                area.sent_at = now
            self._last_send = now
            if text is None or run.header is None:
                # Nothing to show yet, or a cell run before nbcoord could see its request: kept for %nbcoord.
                area.sent_version = version
                return
            create = display_id is None
            if create:
                display_id = f"nbcoord-output-{os.getpid()}-{next(self._display_ids)}"
            content = {
                "data": {MIME: text},
                "metadata": {"nbcoord": {"background_output": True}},
                "transient": {"display_id": display_id},
            }
            publish = self._publish
            if publish is None:
                return
            # A new area is placed under its cell's own request; an update is matched by its display id alone, and
            # carries the request running now (nbclient then updates the area's cell, not the running one).
            parent = run.header if create else _header_of(getattr(self._shell, "parent_header", None))
            publish("display_data" if create else "update_display_data", content, parent)
            with area.lock:
                if area.run is run:  # not moved to a new run meanwhile
                    area.display_id = display_id
                area.sent_version = version
                area.updated_at = time.time()
        except Exception:
            self._log_once("send", "nbcoord: sending background output failed")
        finally:
            area.send_lock.release()

    # --------------------------------------------------------------------------------------------- views
    def section(self) -> dict[str, Any]:
        """The snapshot source: ``{"outputs": [OutputRow, ...]}``, oldest area first."""
        return {"outputs": [area.row() for area in self._areas_now()]}

    def _log_once(self, what: str, message: str) -> None:
        first = what not in self._logged
        self._logged.add(what)
        if first:
            log.warning(message, exc_info=True)
        else:
            log.debug(message, exc_info=True)


def install(host: Host) -> OutputRouter:
    """Install background-output routing for ``host``; ``uninstall()`` on the result removes it."""
    router = OutputRouter(host)
    try:
        router.install()
    except BaseException:
        router.uninstall()
        raise
    return router
