// @ts-check
/**
 * nbcoord's live panel: the front end of nbcoord.ui.widget.NBCoordPanel (anywidget).
 *
 * State arrives in traits set by the kernel (header, cell_memory, sessions, queues, blocked, resources, failures,
 * history, last_stop, outcome, stack, clock, beat, ack), and the rows (threads, ledger, groups, cells) by difference
 * in one "rows" message per change (rows.js: a view that opens or misses one asks for every row); this module only
 * draws it and sends commands (stop, restart, reclaim, stack, view), each with a click id. Every string from the
 * kernel is set with textContent, after control and bidirectional characters are shown escaped (`safe`):
 * nothing from the kernel is ever parsed as HTML, and no name can reorder the text around it. Names arrive cut
 * to 200 characters by the kernel (nbcoord.ui.state.NAME_CHARS), longer texts to 500.
 *
 * Drawing is keyed: each section has its own draw function, run only when a trait it shows changed; lists
 * (groups, rows, queues) keep one node per key and touch a node only when its data changed, so scroll
 * positions, focus, open stacks and tracebacks survive updates.
 *
 * Figures that move on their own ("idle 5 s", "5 s ago", how long a run has been blocked) are computed here
 * from the kernel's absolute times, corrected for clock skew by the kernel's clock, echoed once per view
 * ("clock" trait), and redrawn every second whether or not the kernel sends anything.
 *
 * The kernel acknowledges every click at once ("ack"); a click without an acknowledgement within a second was
 * not handled, because the kernel's main thread holds the GIL in a C call: the panel says so, and since when.
 * While a cell runs the kernel sends a beat every interval; when beats stop the panel says the same. A kernel that
 * owes an answer (a running cell, a busy page, an execute request the page sent, a click) and has said nothing for
 * 2 s is read from outside: nbcoord's server extension reads its stacks (outside.js), and the banner says where
 * its main thread is and offers Interrupt and Restart (quiet.js, sections/status.js). The status line never says
 * "kernel idle" while the kernel is silent: the busy status of a cell that holds the GIL waits behind it too.
 * A view whose kernel is gone (restarted, shut down) says so at once, greys out and disables its buttons.
 *
 * The sources are small modules bundled into one file (js/build.mjs, esbuild): anywidget loads the panel as one
 * module text. sections.js registers the sections; sections/ holds one draw module each; render.js is the view.
 */

import { render } from "./render.js";

export { safe } from "../shared/text.js";
export { sendCommand } from "./kernel.js";

export default { render };
