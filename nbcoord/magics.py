"""``%nbcoord``: a thin Magics class over the engine. It parses, calls, and prints."""

from __future__ import annotations

from typing import Any, Protocol

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import TraitError

from nbcoord import report as _report
from nbcoord.core.checks import stop_scope
from nbcoord.core.config import RUNTIME_SETTINGS, NBCoord
from nbcoord.core.snapshot import Snapshot
from nbcoord.core.stop import ScopeKind, StopReport
from nbcoord.core.text import printable

COMMANDS = ("report", "threads", "zombies", "json", "stop", "config", "mem", "panel", "restart", "reclaim")
_STOP_OPTIONS = ("grace", "force", "cell", "thread", "zombies")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_setting(name: str, text: str) -> float | int | bool:
    """Parse ``name=text`` for ``%nbcoord config``; a bad value is a UsageError."""
    kind = RUNTIME_SETTINGS.get(name)
    if kind is None:
        raise UsageError(f"Unknown setting {name!r}; settings are: {', '.join(sorted(RUNTIME_SETTINGS))}.")
    if kind is bool:
        lowered = text.lower()
        if lowered not in _TRUE | _FALSE:
            raise UsageError(f"{name} takes true or false, not {text!r}.")
        return lowered in _TRUE
    try:
        return kind(text)  # type: ignore[no-any-return]
    except ValueError:
        raise UsageError(f"{name} takes a number, not {text!r}.") from None


def _say(text: str) -> None:
    """Print a report: a name that got past the report's own escaping still cannot recolour, rewrite or reorder
    the lines around it (Jupyter renders ANSI codes and carriage returns)."""
    print(printable(text, keep="\n"))


class Engine(Protocol):
    """What the magics call: the loaded extension's entry points (:class:`nbcoord._wiring.Extension`)."""

    @property
    def config(self) -> NBCoord: ...
    def snapshot(self, *, stacks: bool = False, waits: bool = False) -> Snapshot: ...
    def stop(
        self, kind: ScopeKind = "all", *, grace: float | None = None, force: bool = False, cell: int | None = None,
        tid: str | None = None,
    ) -> StopReport: ...
    def degraded(self) -> dict[str, str]: ...
    def fresh_resources(self) -> None: ...
    def reclaim(self, *, outputs: bool = False) -> Any: ...
    def native_stacks(self) -> Any: ...
    def restart_runners(self, session: Any, *, grace: float | None = None) -> dict[str, Any]: ...
    def panel(self) -> Any: ...


@magics_class
class NBCoordMagics(Magics):
    """The ``%nbcoord`` line magic."""

    def __init__(self, shell: Any, extension: Engine) -> None:
        super().__init__(shell)
        self.extension = extension

    @magic_arguments()
    @argument(
        "command",
        nargs="?",
        default="report",
        help=(
            "report (default): threads by cell, zombies first, queues, failures, memory; "
            "threads: the thread list, what each blocked thread waits on, deadlocks; "
            "zombies: only zombies; json: the snapshot as JSON; "
            "stop: the bounded stop; config: show or set settings (name=value); "
            "mem: memory, GPU, native threads, child processes; panel: the live widget panel; "
            "restart SESSION: restart a TensorFlow session's queue runners (stop, reset closed queues, start again); "
            "reclaim: give back memory the kernel keeps by accident (IPython's last exception, with --outputs the "
            "output cache; framework caches) and list what is still held"
        ),
    )
    @argument("settings", nargs="*", help="for config: name=value pairs; for restart: the session id")
    @argument("--all", action="store_true", help="threads: include threads that existed before loading")
    @argument("--stacks", action="store_true", help="threads/zombies: include each thread's current stack")
    @argument(
        "--native", action="store_true",
        help="threads: the C functions of threads stuck in C (read by a child process; pauses the kernel ~0.3 s)",
    )
    @argument("--grace", type=float, default=None, help="stop: seconds to wait for threads (default: config)")
    @argument("--force", action="store_true", help="stop: raise an exception in threads that ignore the stop")
    @argument("--cell", type=int, default=None, help="stop: only the threads started by this cell")
    @argument("--thread", default=None, metavar="ID", help="stop: only this thread (its id, e.g. t12)")
    @argument("--zombies", action="store_true", help="stop: only zombie threads")
    @argument("--outputs", action="store_true", help="reclaim: also drop the output cache (Out, _, __, ___, _N)")
    @line_magic
    def nbcoord(self, line: str = "") -> Any:
        """Show what the kernel's threads are doing, and stop them.

        Examples::

            %nbcoord                    # report
            %nbcoord zombies
            %nbcoord threads --stacks
            %nbcoord stop --grace 2     # stop everything nbcoord knows, wait up to 2 s
            %nbcoord stop --cell 5      # only what cell [5] started
            %nbcoord config grace_period=2
            %nbcoord restart s1         # a TensorFlow session's queue runners, stopped and started again
            %nbcoord reclaim --outputs  # memory back from the last error and the output cache
        """
        args = parse_argstring(self.nbcoord, line)
        command = args.command
        if command not in COMMANDS:
            raise UsageError(f"Unknown command {command!r}; use one of: {', '.join(COMMANDS)}.")
        if command not in ("config", "restart") and args.settings:
            raise UsageError(f"Unexpected argument(s) {' '.join(args.settings)!r} for %nbcoord {command}.")
        if command != "stop":
            allowed = ("grace",) if command == "restart" else ()
            given = [opt for opt in _STOP_OPTIONS if opt not in allowed and getattr(args, opt) not in (None, False)]
            if given:
                raise UsageError(f"--{given[0]} only goes with %nbcoord stop.")
        if command != "threads" and args.native:
            raise UsageError("--native only goes with %nbcoord threads.")
        if command != "reclaim" and args.outputs:
            raise UsageError("--outputs only goes with %nbcoord reclaim.")
        return getattr(self, f"_cmd_{command}")(args)

    # ---------------------------------------------------------------------------------------- commands
    def _cmd_report(self, args: Any) -> None:
        snapshot = self.extension.snapshot(stacks=args.stacks, waits=True)
        _say(
            _report.report(
                snapshot,
                show_all=args.all,
                stacks=args.stacks,
                limit=self.extension.config.max_report_threads,
                degraded=self.extension.degraded(),
            )
        )

    def _cmd_threads(self, args: Any) -> None:
        snapshot = self.extension.snapshot(stacks=args.stacks, waits=True)
        rows = [r for r in snapshot["threads"] if args.all or r["user"]]
        lines = [_report.summary_line(snapshot)]
        lines += _report.threads_section(
            snapshot, rows, stacks=args.stacks, limit=self.extension.config.max_report_threads
        )
        lines += _report.deadlocks_section(snapshot)
        if args.native:
            lines += _report.native_section(self.extension.native_stacks(), snapshot)
        _say("\n".join(lines))

    def _cmd_zombies(self, args: Any) -> None:
        _say(_report.zombies_report(self.extension.snapshot(stacks=args.stacks), stacks=args.stacks))

    def _cmd_json(self, args: Any) -> None:
        _say(_report.to_json(self.extension.snapshot(stacks=args.stacks)))

    def _cmd_stop(self, args: Any) -> None:
        try:
            kind, cell, tid = stop_scope(cell=args.cell, thread=args.thread, zombies=args.zombies)
            report = self.extension.stop(kind, grace=args.grace, force=args.force, cell=cell, tid=tid)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
        _say(_report.stop_report(report))

    def _cmd_config(self, args: Any) -> None:
        config = self.extension.config
        changed: list[str] = []
        for item in args.settings:
            name, sep, value = item.partition("=")
            name, value = name.strip(), value.strip()
            if not sep:
                raise UsageError(f"Settings are name=value, not {item!r}.")
            try:
                setattr(config, name, parse_setting(name, value))
            except TraitError as exc:
                raise UsageError(f"{name} cannot be {value!r}: {exc}") from None
            changed.append(name)
        for name in changed or sorted(RUNTIME_SETTINGS):
            print(f"{name} = {getattr(config, name)!r}")

    def _cmd_mem(self, args: Any) -> None:
        self.extension.fresh_resources()  # what started a moment ago is counted
        snapshot = self.extension.snapshot()
        lines = _report.resources_section(snapshot, details=True) or ["nbcoord: no resource data."]
        _say("\n".join(lines))

    def _cmd_restart(self, args: Any) -> None:
        if len(args.settings) != 1:
            raise UsageError("Name one session: %nbcoord restart s1 (%nbcoord lists the sessions with stuck runners).")
        try:
            report = self.extension.restart_runners(args.settings[0], grace=args.grace)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise UsageError(str(exc)) from None
        _say(report["text"])

    def _cmd_reclaim(self, args: Any) -> None:
        _say(self.extension.reclaim(outputs=args.outputs)["text"])

    def _cmd_panel(self, args: Any) -> Any:
        return self.extension.panel()
