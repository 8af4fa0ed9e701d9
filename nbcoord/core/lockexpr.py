"""Which object a frame's current instruction works on, and which ``with`` statements enclose its current line: how
a wait report names a lock (``a``, ``self.lock``) and finds who holds it, without running any of the user's code.

- :func:`blocking_call`: the frame's current instruction (``f_lasti``, read with :mod:`dis`) is a ``with`` entry
  (``SETUP_WITH`` on 3.10, ``BEFORE_WITH`` on 3.11-3.13) or a call of a named method (``x.acquire(...)``); the
  receiver is the chain of loads before it (``LOAD_FAST self``, ``LOAD_ATTR lock``): a name, then attributes.
- :func:`held_chains`: the ``with`` statements of the frame's own function (or module, or class body) whose body
  holds the current line, from the source's AST (``linecache``: IPython puts each cell's source there). Parsed
  sources are kept in a small LRU by (file, hash of the source), never a code object or a frame.
- :func:`resolve`: a chain's object, looked up in the frame's locals then globals, attributes read with
  :func:`nbcoord.core.internals.static_attribute` (no property, no ``__getattr__`` runs).

Anything not recognised gives None: an expression other than a name and attributes, a Python whose bytecode differs.
"""

from __future__ import annotations

import ast
import dis
import linecache
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, Final

from nbcoord.core.internals import static_attribute

#: A name followed by attributes: ``("self", "lock")`` is ``self.lock``.
Chain = tuple[str, ...]

WITH_OPS: Final = frozenset({"BEFORE_WITH", "SETUP_WITH"})
CALL_OPS: Final = frozenset({"CALL", "CALL_METHOD", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_KW"})
_NAME_OPS: Final = frozenset({
    "LOAD_NAME", "LOAD_GLOBAL", "LOAD_FAST", "LOAD_DEREF", "LOAD_FAST_CHECK", "LOAD_CLASSDEREF", "LOAD_FAST_LOAD_FAST",
    "LOAD_FROM_DICT_OR_DEREF", "LOAD_FROM_DICT_OR_GLOBALS", "LOAD_FAST_BORROW",
})
_METHOD_OPS: Final = frozenset({"LOAD_METHOD", "LOAD_ATTR"})
#: What may stand between a method's load and its call: plain arguments (constants, names, attributes).
_ARG_OPS: Final = frozenset({"LOAD_CONST", "LOAD_SMALL_INT", "KW_NAMES", "PRECALL", "PUSH_NULL", "CACHE", "NOP",
                             "EXTENDED_ARG", "LOAD_ATTR"}) | _NAME_OPS
_SKIP_OPS: Final = frozenset({"CACHE", "PRECALL", "PUSH_NULL", "NOP", "EXTENDED_ARG"})
#: Instructions kept before the current one (a call's arguments and its receiver's chain fit in far fewer).
_WINDOW: Final = 48
_MAX_CHAIN: Final = 8
#: Parsed sources kept, and the largest source parsed (a huge generated file is not worth it).
CACHE_SIZE: Final = 64
MAX_SOURCE_CHARS: Final = 2_000_000


def chain_text(chain: Chain) -> str:
    return ".".join(chain)


# ------------------------------------------------------------------------------------------------ bytecode
def _window(code: CodeType, lasti: int) -> list[dis.Instruction]:
    """The instructions up to and including the one at ``lasti`` (at most ``_WINDOW``)."""
    kept: deque[dis.Instruction] = deque(maxlen=_WINDOW)
    for instruction in dis.get_instructions(code):
        if instruction.offset > lasti:
            break
        kept.append(instruction)
    return list(kept)


def _name(instruction: dis.Instruction) -> str | None:
    value = instruction.argval
    if isinstance(value, tuple) and value:  # LOAD_FAST_LOAD_FAST pushes two: the receiver is the second
        value = value[-1]
    return value if isinstance(value, str) else None


def _chain_before(instructions: list[dis.Instruction], end: int) -> Chain | None:
    """The name-and-attributes chain whose loads end just before ``instructions[end]``."""
    parts: list[str] = []
    index = end - 1
    while index >= 0 and len(parts) <= _MAX_CHAIN:
        instruction = instructions[index]
        index -= 1
        if instruction.opname in _SKIP_OPS:
            continue
        name = _name(instruction)
        if name is None:
            return None
        parts.append(name)
        if instruction.opname in _NAME_OPS:
            return tuple(reversed(parts))
        if instruction.opname != "LOAD_ATTR":
            return None
    return None


def _current_op(code: CodeType, lasti: int) -> tuple[str, int]:
    """The name and offset of the instruction at ``lasti`` (3.11: a caller's ``f_lasti`` is in its CALL's caches)."""
    raw = code.co_code
    if not 0 <= lasti < len(raw):
        return "", lasti
    opname = dis.opname[raw[lasti]]
    steps = 0
    while opname == "CACHE" and lasti >= 2 and steps < 32:
        lasti -= 2
        steps += 1
        opname = dis.opname[raw[lasti]]
    return opname, lasti


def _method_call(instructions: list[dis.Instruction], methods: frozenset[str]) -> tuple[str | None, Chain] | None:
    """The receiver of the call that is the last instruction, if it calls one of ``methods`` with plain arguments."""
    for index in range(len(instructions) - 2, -1, -1):
        instruction = instructions[index]
        if instruction.opname in _METHOD_OPS and instruction.argval in methods:
            chain = _chain_before(instructions, index)
            return (str(instruction.argval), chain) if chain else None
        if instruction.opname not in _ARG_OPS:
            break
    return None


def blocking_call(frame: FrameType, methods: frozenset[str]) -> tuple[str | None, Chain] | None:
    """``(None, chain)`` when the frame's current instruction enters ``with chain:``; ``(method, chain)`` when it
    calls ``chain.method(...)`` for one of ``methods`` with plain arguments; else None."""
    code = frame.f_code
    opname, lasti = _current_op(code, frame.f_lasti)
    entering = opname in WITH_OPS
    if not entering and (opname not in CALL_OPS or methods.isdisjoint(code.co_names)):
        return None  # the cheap test: most frames end here, without reading the bytecode
    instructions = _window(code, lasti)
    if not instructions:
        return None
    if entering:
        chain = _chain_before(instructions, len(instructions) - 1)
        return (None, chain) if chain else None
    return _method_call(instructions, methods)


def receiver(frame: FrameType, method: str | None) -> Chain | None:
    """The chain of the object the frame's current instruction calls ``method`` on (None: enters a ``with``)."""
    found = blocking_call(frame, frozenset({method}) if method else frozenset())
    if found is None or found[0] != method:
        return None
    return found[1]


# ----------------------------------------------------------------------------------------------- resolving
_MISSING: Final = object()


def _lookup(namespace: Any, name: str) -> Any:
    """``namespace[name]`` for a frame's locals (a dict, or 3.13's frame proxy), never a user's own mapping."""
    if type(namespace) is dict:
        return namespace.get(name, _MISSING)
    if type(namespace).__name__ == "FrameLocalsProxy":
        try:
            return namespace.get(name, _MISSING)
        except Exception:
            return _MISSING
    return _MISSING


def local(frame: FrameType, name: str) -> Any:
    """A local of the frame (None when it has none by that name)."""
    try:
        value = _lookup(frame.f_locals, name)
    except Exception:
        return None
    return None if value is _MISSING else value


def resolve(frame: FrameType, chain: Chain) -> Any:
    """The object ``chain`` names in the frame (locals, then globals), or None."""
    try:
        value = _lookup(frame.f_locals, chain[0])
        if value is _MISSING:
            value = _lookup(frame.f_globals, chain[0])
    except Exception:
        return None
    if value is _MISSING:
        return None
    for attribute in chain[1:]:
        if value is None:
            return None
        value = static_attribute(value, attribute)
    return value


# ---------------------------------------------------------------------------------------------- with sites
@dataclass(frozen=True)
class WithSite:
    """One ``with`` statement: the scope it is in (first line of its def or class, decorators included; 0: the
    module), its first line, its body's first line, its last line, and each item's chain (None: not a chain)."""

    scope: int
    start: int
    body: int
    end: int
    items: tuple[Chain | None, ...]


def _expression_chain(node: ast.expr) -> Chain | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute) and len(parts) < _MAX_CHAIN:
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return tuple(reversed(parts))


def _scopes(tree: ast.AST) -> Iterator[tuple[ast.AST, int]]:
    """Every node with the scope it runs in (iteratively: a deeply nested source cannot exhaust the stack)."""
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, scope = stack.pop()
        yield node, scope
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stack.append((child, min([child.lineno, *(d.lineno for d in child.decorator_list)])))
            elif not isinstance(child, ast.Lambda):
                stack.append((child, scope))


def _sites(source: str) -> tuple[WithSite, ...]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    found = [
        WithSite(scope, node.lineno, node.body[0].lineno, node.end_lineno or node.lineno,
                 tuple(_expression_chain(item.context_expr) for item in node.items))
        for node, scope in _scopes(tree)
        if isinstance(node, ast.With) and node.body
    ]
    found.sort(key=lambda site: site.start)
    return tuple(found)


class _SiteCache:
    """Parsed ``with`` sites by (file name, hash of its source), least recently used dropped first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()  # guards _entries: the control thread and the main thread may both analyse
        self._entries: OrderedDict[tuple[str, int], tuple[WithSite, ...]] = OrderedDict()
        self.parsed = 0  # how many sources were parsed (tests check the cache works)

    def sites(self, filename: str) -> tuple[WithSite, ...]:
        lines = linecache.getlines(filename)
        if not lines:
            return ()
        source = "".join(lines)
        if len(source) > MAX_SOURCE_CHARS:
            return ()
        key = (filename, hash(source))
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        found = _sites(source)  # parsed outside the lock: two threads may parse the same source once each
        with self._lock:
            self.parsed += 1
            self._entries[key] = found
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return found


SITES = _SiteCache(CACHE_SIZE)


def held_chains(frame: FrameType, entering: Chain | None = None) -> list[Chain]:
    """The chains of the ``with`` items the frame is inside now, outermost first. ``entering``: the item the frame
    is entering (its current instruction); the items before it on the same statement are held already."""
    code = frame.f_code
    line = frame.f_lineno
    if line is None:
        return []
    scope = 0 if code.co_name == "<module>" else code.co_firstlineno
    held: list[Chain] = []
    for site in SITES.sites(code.co_filename):
        if site.start > line:
            break
        if site.scope != scope or line > site.end:
            continue
        if line >= site.body:
            held.extend(item for item in site.items if item is not None)
        elif entering is not None and entering in site.items:
            held.extend(item for item in site.items[: site.items.index(entering)] if item is not None)
    return held
