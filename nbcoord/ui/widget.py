"""The panel's widget: an AnyWidget whose traits are the state, set by the kernel only.

Traits are the state; custom messages are for commands (a click), and for the rows (threads, ledger, groups,
cells), which go by difference in one message per change (:mod:`nbcoord.ui.rowsync`): a view that opens asks for
them, so no state is lost to a message sent before a view existed. The front end cannot write the state
(:meth:`NBCoordPanel.set_state` refuses it). Without a widget front end (nbconvert, a terminal) the widget shows
as the ``%nbcoord`` text report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import anywidget
import traitlets

from nbcoord.core.log import RateLimited, short
from nbcoord.ui import sections

log = logging.getLogger("nbcoord")
#: A front end can send state updates as fast as it likes: a few lines a minute, keys cut short.
_log_refused_state = RateLimited(logging.WARNING, burst=5, window=60.0)

#: Every section's trait (``_esm`` and ``_fast_route`` aside): what the front end draws (one per registered section;
#: the ``rows`` sections' are not synced).
STATE_TRAITS: Final = sections.STATE_TRAITS


def esm_path() -> Path:
    """The panel's ES module: inside the wheel at ``nbcoord/static``, in a checkout at ``js/``."""
    packaged = Path(__file__).parent.parent / "static" / "panel.js"
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "js" / "panel.js"


def _read_esm() -> str:
    # The text, not the Path: given a Path, anywidget may start a file-watching thread in a checkout.
    try:
        return esm_path().read_text(encoding="utf-8")
    except OSError:
        log.warning("nbcoord: the panel's module is missing at %s", esm_path(), exc_info=True)
        return "export default { render({ el }) { el.textContent = 'nbcoord: panel module missing'; } };"


def _trait(section: sections.Section) -> Any:
    """The trait of a registered section, of its kind: synced, but for the ``rows`` sections, which travel by
    difference in the rows message (:mod:`nbcoord.ui.rowsync`) and are kept here as the views have them."""
    sync = section.pacing != "rows"
    if section.kind == "list":
        return traitlets.List(help=section.doc).tag(sync=sync)
    if section.kind == "optional":
        return traitlets.Dict(allow_none=True, default_value=None, help=section.doc).tag(sync=sync)
    return traitlets.Dict(help=section.doc).tag(sync=sync)


class NBCoordPanel(anywidget.AnyWidget):
    """The panel widget. Its state is set by the panel's sender thread only; the front end cannot write it."""

    _esm = _read_esm()

    # One synced trait per registered section (nbcoord.ui.sections.SECTIONS), set in the class namespace so that
    # traitlets' metaclass sees them as declared here (a class body's locals() is that namespace: PEP 667).
    locals().update({section.trait: _trait(section) for section in sections.SECTIONS})
    _fast_route = traitlets.Dict().tag(sync=True)

    def __init__(self, text_form: Callable[[], str], on_display: Callable[[], None], **state: Any) -> None:
        self._text_form = text_form
        self._on_display = on_display
        super().__init__(**state)

    def set_state(self, sync_data: Any) -> None:
        """Refuse state from the front end: the panel's state is the kernel's to set."""
        keys = [short(key) for key in sorted(map(str, sync_data))[:5]] if isinstance(sync_data, Mapping) else []
        _log_refused_state("nbcoord: panel rejected a state update from the front end (keys %s)", ", ".join(keys))

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        try:
            text = self._text_form()
        except Exception:
            log.warning("nbcoord: the panel's text form failed", exc_info=True)
            text = "nbcoord panel (the text report failed; see the kernel log)"
        try:
            self._on_display()
        except Exception:
            log.warning("nbcoord: panel display hook failed", exc_info=True)
        return {**data, "text/plain": text}, metadata
