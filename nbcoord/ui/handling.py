"""The panel's command handling: each command from either route checked, taken once, acknowledged, handed on.

Commands arrive by two routes: the fast route of :mod:`nbcoord.kernel.fastcomm` (handled off the main thread, so
a click acts while a cell is busy) and the widget's ordinary message (handled when the main thread is free); the
first to arrive acts, the other is dropped by its ``click_id``. Every command is checked against the ids this
kernel issued (:func:`.commands.parse_command`; a thread's id by the one check of a stop's thread,
``Host.check_stoppable``). Each action taken is acknowledged at once (:class:`.acks.Acknowledger`), then handed to
where it runs: stops and restarts to the action thread (:class:`.commands.StopRunner`), reclaims to the main
thread (:class:`.actions.Reclaims`); a view's presence and a stack request to the controller. A command that fails
its checks is rejected through the rate-limited log (:func:`.commands.reject`); one that raises anyway (a bug) is
logged through a rate limit too, in one line: never a traceback per message.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from nbcoord.core.host import Host
from nbcoord.core.log import RateLimited, short
from nbcoord.core.text import NAME_CHARS
from nbcoord.ui.acks import Acknowledger
from nbcoord.ui.actions import Reclaims
from nbcoord.ui.answers import Answers
from nbcoord.ui.commands import (
    ACTION_TYPES,
    ClickLedger,
    Command,
    Rejected,
    StopRunner,
    joined_commands,
    parse_command,
    reject,
    thread_check,
)
from nbcoord.ui.fields import name_cut

log = logging.getLogger("nbcoord")

#: The click id a joined command is checked with (its clicks' own ids are checked one by one).
JOINED_PLACEHOLDER: Final = "joined-0"
#: Commands that raised (a bug, not a rejection): a few lines a minute at most, whatever floods in.
log_failure = RateLimited(logging.WARNING, burst=3, window=60.0)


class CommandDesk:
    """Takes the panel's commands: checks, drops second copies, acknowledges and hands each to where it runs.

    ``restartable()`` gives the sessions of the last state whose runners can restart; ``view(command)`` and
    ``stack(command)`` are the controller's handling of a view's presence and of a stack request.
    """

    def __init__(
        self,
        host: Host,
        *,
        acks: Acknowledger,
        stops: StopRunner,
        reclaims: Reclaims,
        answers: Answers,
        restartable: Callable[[], frozenset[str]],
        view: Callable[[Command], None],
        stack: Callable[[Command], None],
    ) -> None:
        self._acks = acks
        self._stops = stops
        self._reclaims = reclaims
        self._answers = answers
        self._restartable = restartable
        self._view = view
        self._stack = stack
        registry = host.registry
        self._thread_exists = thread_check(host.check_stoppable)
        self._cell_exists: Callable[[int], bool] = lambda n: registry.cell(n) is not None
        self.clicks = ClickLedger()
        self.duplicates: collections.deque[str] = collections.deque(maxlen=64)  # click ids dropped as seen

    def handle(self, content: object, *, route: str, joined: Sequence[str] = ()) -> None:
        """Validate and run one command from the front end; never raises.

        ``joined``: instead of ``content``'s own click, the clicks of equal commands (but for their click id) that
        the fast route joined to it; each is checked and acted on once, as if it had come on its own.
        """
        try:
            self._handle(content, route, joined)
        except Exception as error:
            # Every field is checked before use, so this is a bug; a front end that finds it must not be able to
            # write a traceback per message: one line, rate-limited, with where it raised and the content cut short.
            tb = error.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"
            log_failure(
                "nbcoord: a panel command raised %s at %s: %s",
                name_cut(f"{type(error).__name__}: {error}", NAME_CHARS),
                name_cut(where, NAME_CHARS),
                name_cut(short(content), NAME_CHARS),
            )

    def _handle(self, content: object, route: str, joined: Sequence[str]) -> None:
        received = time.time()
        restartable = self._restartable()
        if joined and isinstance(content, Mapping):
            # The clicks' common command is checked as any command is; each click id on its own, below.
            content = {**content, "click_id": JOINED_PLACEHOLDER}
        try:
            command = parse_command(
                content,
                thread_exists=self._thread_exists,
                cell_exists=self._cell_exists,
                session_exists=lambda sid: sid in restartable,
            )
        except Rejected as why:
            reject(why, content)
            return
        command = dataclasses.replace(command, route=route, received_at=received)
        commands = [command] if not joined else joined_commands(command, joined)
        commands = [c for c in commands if self._first_time(c)]
        if not commands:
            return
        if command.type == "view":
            self._view(commands[-1])
            return
        if command.type in ACTION_TYPES:
            self._acks.acknowledge(commands[0], received, route, [c.click_id for c in commands[1:]])
        if command.type == "stack":
            self._stack(commands[-1])
        elif command.type == "reclaim":
            self._reclaims.submit(commands)
        else:
            refusal = self._stops.submit_all(commands)
            if refusal is not None:
                self._answers.failed(commands, Rejected(refusal), refused=True)

    def _first_time(self, command: Command) -> bool:
        if self.clicks.first_time(command.click_id):
            return True
        self.duplicates.append(command.click_id)  # the other route's copy: already handled
        return False
