"""``%nbcoord``: a thin Magics class around the extension. It parses, calls, and prints."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import TraitError

from . import _report
from ._config import RUNTIME_SETTINGS
from ._lifecycle import Extension
from ._stop import ScopeKind

COMMANDS = ("report", "threads", "zombies", "json", "stop", "config", "mem", "panel")
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


@magics_class
class NBCoordMagics(Magics):
    """The ``%nbcoord`` line magic."""

    def __init__(self, shell: Any, extension: Extension) -> None:
        super().__init__(shell)
        self.extension = extension

    @magic_arguments()
    @argument(
        "command",
        nargs="?",
        default="report",
        help=(
            "report (default): threads by cell, zombies first, queues, failures, memory; "
            "threads: the thread list; zombies: only zombies; json: the snapshot as JSON; "
            "stop: the bounded stop; config: show or set settings (name=value); "
            "mem: memory, GPU, native threads, child processes; panel: the live widget panel"
        ),
    )
    @argument("settings", nargs="*", help="for config: name=value pairs")
    @argument("--all", action="store_true", help="threads: include threads that existed before loading")
    @argument("--stacks", action="store_true", help="threads/zombies: include each thread's current stack")
    @argument("--grace", type=float, default=None, help="stop: seconds to wait for threads (default: config)")
    @argument("--force", action="store_true", help="stop: raise an exception in threads that ignore the stop")
    @argument("--cell", type=int, default=None, help="stop: only the threads started by this cell")
    @argument("--thread", default=None, metavar="ID", help="stop: only this thread (its id, e.g. t12)")
    @argument("--zombies", action="store_true", help="stop: only zombie threads")
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
        """
        args = parse_argstring(self.nbcoord, line)
        command = args.command
        if command not in COMMANDS:
            raise UsageError(f"Unknown command {command!r}; use one of: {', '.join(COMMANDS)}.")
        if command != "config" and args.settings:
            raise UsageError(f"Unexpected argument(s) {' '.join(args.settings)!r} for %nbcoord {command}.")
        if command != "stop":
            given = [opt for opt in _STOP_OPTIONS if getattr(args, opt) not in (None, False)]
            if given:
                raise UsageError(f"--{given[0]} only goes with %nbcoord stop.")
        return getattr(self, f"_cmd_{command}")(args)

    # ---------------------------------------------------------------------------------------- commands
    def _cmd_report(self, args: Any) -> None:
        snapshot = self.extension.snapshot(stacks=args.stacks)
        print(
            _report.report(
                snapshot,
                show_all=args.all,
                stacks=args.stacks,
                limit=self.extension.config.max_report_threads,
            )
        )

    def _cmd_threads(self, args: Any) -> None:
        snapshot = self.extension.snapshot(stacks=args.stacks)
        rows = [r for r in snapshot["threads"] if args.all or r["user"]]
        lines = [_report.summary_line(snapshot)]
        lines += _report.threads_section(
            snapshot, rows, stacks=args.stacks, limit=self.extension.config.max_report_threads
        )
        print("\n".join(lines))

    def _cmd_zombies(self, args: Any) -> None:
        print(_report.zombies_report(self.extension.snapshot(stacks=args.stacks), stacks=args.stacks))

    def _cmd_json(self, args: Any) -> None:
        print(_report.to_json(self.extension.snapshot(stacks=args.stacks)))

    def _cmd_stop(self, args: Any) -> None:
        scopes = [name for name in ("cell", "thread") if getattr(args, name) is not None]
        if args.zombies:
            scopes.append("zombies")
        if len(scopes) > 1:
            raise UsageError("Choose one of --cell, --thread and --zombies.")
        if args.grace is not None and args.grace < 0:
            raise UsageError("--grace takes a number of seconds >= 0.")
        kind: ScopeKind = scopes[0] if scopes else "all"  # type: ignore[assignment]
        try:
            report = self.extension.stop(kind, grace=args.grace, force=args.force, cell=args.cell, tid=args.thread)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(_report.stop_report(report))

    def _cmd_config(self, args: Any) -> None:
        config = self.extension.config
        for item in args.settings:
            name, sep, value = item.partition("=")
            if not sep:
                raise UsageError(f"Settings are name=value, not {item!r}.")
            try:
                setattr(config, name.strip(), parse_setting(name.strip(), value.strip()))
            except TraitError as exc:
                raise UsageError(f"{name.strip()} cannot be {value.strip()!r}: {exc}") from None
        for name in sorted(RUNTIME_SETTINGS):
            print(f"{name} = {getattr(config, name)!r}")

    def _cmd_mem(self, args: Any) -> None:
        print("\n".join(_report.resources_section(self.extension.snapshot()) or ["nbcoord: no resource data."]))

    def _cmd_panel(self, args: Any) -> Any:
        return self.extension.panel()
