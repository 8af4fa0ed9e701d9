// @ts-check
/**
 * The kernel seen from outside, when it cannot answer the panel itself: its stacks as nbcoord's server extension
 * reads them (``GET {baseUrl}nbcoord/api/kernels/<id>/stacks``, schema "nbcoord.stacks/1"), and the two ways out
 * that do not need the kernel's main thread: Interrupt and Restart, through the page's kernel connection where it
 * has them, else through jupyter_server's own REST API.
 *
 * Nothing here runs where the page has no Jupyter config (VS Code): there is no server to ask.
 */

import { isNum } from "../shared/text.js";
import { baseUrl, kernelOf } from "./kernel.js";

/** The schema of the stacks endpoint's answer this panel reads. */
export const STACKS_SCHEMA = "nbcoord.stacks/1";

/** The page's ``_xsrf`` cookie, as jupyter_server wants it in ``X-XSRFToken``. @returns {Record<string, string>} */
function xsrfHeaders() {
  const match = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
  return match ? { "X-XSRFToken": decodeURIComponent(match[1]) } : {};
}

/**
 * The main thread of a stacks answer.
 * @typedef {{
 *   tid: number, holds_gil: boolean, in_c: boolean, doing: string, cell: number | null, line: number | null,
 *   function: string | null, since: number | null, since_exact: boolean,
 * }} MainThread
 */

/**
 * What one read of the stacks gave: an answer (``available`` false carries the server's one-sentence reason), or
 * no server to ask (``missing``: no nbcoord extension there, or one without the endpoint), or a failure.
 * @typedef {{
 *   kind: "answer", available: boolean, reason: string | null, main: MainThread | null, readAt: number,
 *   native: Array<{symbol: string, library: string}>,
 * } | { kind: "missing" } | { kind: "failed", why: string }} StacksRead
 * native: the main thread's native frames, innermost last (empty unless asked for and read).
 */

/**
 * Read the kernel's stacks from the server; never throws.
 * @param {string} base the server's base URL (``baseUrl()``)
 * @param {string} kernelId
 * @param {{ native?: boolean, fetchFn?: typeof fetch }} [options]
 * @returns {Promise<StacksRead>}
 */
export async function readStacks(base, kernelId, options = {}) {
  const fetchFn = options.fetchFn || fetch;
  const url = `${base}nbcoord/api/kernels/${encodeURIComponent(kernelId)}/stacks${options.native ? "?native=1" : ""}`;
  /** @type {Response} */
  let response;
  try {
    response = await fetchFn(url, { credentials: "same-origin", headers: { Accept: "application/json", ...xsrfHeaders() } });
  } catch (err) {
    return { kind: "failed", why: err instanceof Error ? err.message : String(err) };
  }
  /** @type {any} */
  let body = null;
  try {
    body = await response.json();
  } catch (err) {
    body = null;
  }
  if (!response.ok || !body || body.schema !== STACKS_SCHEMA) {
    // A 404 from a server without the endpoint is a page, not the endpoint's JSON: nothing to ask there.
    if (response.status === 404 && !(body && typeof body.message === "string")) return { kind: "missing" };
    const message = body && typeof body.message === "string" ? body.message : `HTTP ${response.status}`;
    return { kind: "failed", why: message };
  }
  return {
    kind: "answer",
    available: body.available === true,
    reason: typeof body.reason === "string" ? body.reason : null,
    main: mainOf(body.main),
    readAt: isNum(body.read_at) ? body.read_at : Date.now() / 1000,
    native: nativeOf(body),
  };
}

/** The main thread's native frames of an answer, innermost last. @param {any} body */
function nativeOf(body) {
  const threads = Array.isArray(body.threads) ? body.threads : [];
  const main = threads.find((t) => t && t.main === true);
  const frames = main && Array.isArray(main.native) ? main.native : [];
  return frames
    .filter((f) => f && typeof f.symbol === "string")
    .map((f) => ({ symbol: String(f.symbol), library: typeof f.library === "string" ? f.library : "" }));
}

/** The main thread of an answer, or null when it is missing or malformed. @param {any} main @returns {MainThread | null} */
function mainOf(main) {
  if (!main || typeof main !== "object" || typeof main.doing !== "string") return null;
  return {
    tid: isNum(main.tid) ? main.tid : 0,
    holds_gil: main.holds_gil === true,
    in_c: main.in_c === true,
    doing: main.doing,
    cell: isNum(main.cell) ? main.cell : null,
    line: isNum(main.line) ? main.line : null,
    function: typeof main.function === "string" ? main.function : null,
    since: isNum(main.since) ? main.since : null,
    since_exact: main.since_exact === true,
  };
}

/**
 * Whether the panel has a way to the kernel from outside: the kernel's id and either the page's kernel connection
 * or the server's API.
 * @param {any} model
 * @returns {{ id: string | null, base: string | null, kernel: any }}
 */
export function outsideOf(model) {
  const kernel = kernelOf(model);
  const id = kernel && typeof kernel.id === "string" && kernel.id ? kernel.id : null;
  return { id, base: baseUrl(), kernel };
}

/**
 * Interrupt or restart the kernel without its main thread: the page's kernel connection does it (through the
 * server's REST API) where it has the method, else a POST to ``{baseUrl}api/kernels/<id>/<action>``.
 * @param {any} model
 * @param {"interrupt" | "restart"} action
 * @returns {Promise<void>} rejected with the reason when it failed
 */
export async function kernelAction(model, action) {
  const { id, base, kernel } = outsideOf(model);
  if (kernel && typeof kernel[action] === "function") {
    await kernel[action]();
    return;
  }
  if (!id || base === null) throw new Error(`this page cannot ${action} the kernel`);
  const response = await fetch(`${base}api/kernels/${encodeURIComponent(id)}/${action}`, {
    method: "POST",
    credentials: "same-origin",
    headers: xsrfHeaders(),
  });
  if (!response.ok) throw new Error(`the server answered ${response.status}`);
}

/**
 * Whether the page can interrupt or restart the kernel from outside at all.
 * @param {any} model
 */
export function canActOutside(model) {
  const { id, base, kernel } = outsideOf(model);
  const both = kernel && typeof kernel.interrupt === "function" && typeof kernel.restart === "function";
  return Boolean(both || (id && base !== null));
}
