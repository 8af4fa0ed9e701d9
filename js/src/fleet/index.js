// @ts-check
/**
 * nbcoord's server page: every kernel of a Jupyter server, what needs attention first, and stop buttons.
 *
 * The page (``/nbcoord/``, served by nbcoord.server) holds one element with ``data-base-url`` and
 * ``data-interval``; this module draws into it from ``GET <base>nbcoord/api/kernels`` every interval, and sends
 * ``POST <base>nbcoord/api/kernels/<id>/stop`` for the buttons, with the server's XSRF token (its ``_xsrf``
 * cookie, sent back as ``X-XSRFToken``). The server authenticates both; nothing here is security.
 *
 * Rows are keyed by kernel id: a refresh updates the text of the rows it finds, adds and removes rows, and puts
 * them in the server's order (what needs attention first); it never rebuilds the table, so a button being
 * clicked stays where it is. Every value from the server (notebook paths, thread names, messages) is set with
 * textContent or as a title, after control and bidirectional characters are shown escaped (`safe`, the one the
 * panel uses: js/src/shared/text.js): nothing is ever parsed as HTML, and no name can hide, reorder or break the
 * text around it (a path with U+202E shows ``\u202e``, never ``...exe.png`` for ``...gnp.exe``).
 *
 * Exports ``render(root, options)``, which returns a cleanup function; the page calls it on its element, and
 * ``safe(value, lines)``. Built into one file with the page's other modules (js/build.mjs).
 */

import { safe } from "../shared/text.js";
import { render } from "./render.js";

export { render, safe };

const page = typeof document !== "undefined" ? document.getElementById("nbcoord-fleet") : null;
if (page && page.dataset.baseUrl) {
  // ``?kernel=<id>``: that kernel alone (compared as a string with the rows' ids, never parsed as HTML).
  const kernel = new URLSearchParams(window.location.search).get("kernel");
  render(page, { baseUrl: page.dataset.baseUrl, interval: Number(page.dataset.interval), kernel });
}

export default { render, safe };
