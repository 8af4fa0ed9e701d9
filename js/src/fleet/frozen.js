// @ts-check
/**
 * Kernels that do not answer: what their main thread is doing, read from outside by the server
 * (``GET <base>nbcoord/api/kernels/<id>/stacks``), and the way out: Interrupt and Restart through the server's own
 * kernel API (``POST <base>api/kernels/<id>/interrupt`` and ``/restart``, with the XSRF token).
 *
 * After an Interrupt, the stacks are read again: a main thread still in the same call (same cell, same start,
 * still holding the GIL) means the call never checks for signals, and the page says so: "Interrupt cannot end this
 * call; Restart will". Restart asks for a second click within 5 s.
 */

import { h, isNum } from "../shared/text.js";

const CONFIRM_MS = 5000;
/** How long what an Interrupt or a Restart did stays shown, also once the kernel answers again. */
const OUTCOME_MS = 30000;
const RECHECK_MS = 1500;
const EXPLAIN = {
  interrupt: "Interrupt sends SIGINT: it ends Python code, not a C call that never checks for signals.",
  restart: "Restart ends the kernel and everything in it (variables are lost) and starts it again.",
};

/**
 * @param {{ base: string, fetchImpl: typeof fetch, xsrf: () => string, redraw: () => void }} options
 */
export function frozenKernels({ base, fetchImpl, xsrf, redraw }) {
  /** @type {Map<string, { read: any, asking: boolean }>} */
  const reads = new Map();
  /** @type {Map<string, { text: string, error: boolean, until: number }>} */
  const outcomes = new Map();
  /** @type {Map<string, number>} */
  const confirming = new Map();

  /** @param {any} k */
  function frozen(k) {
    return k.status === "not-answering" && isNum(k.pid);
  }

  /** @param {string} id @returns {Promise<any>} */
  async function look(id) {
    const state = reads.get(id) || { read: null, asking: false };
    if (state.asking) return state.read;
    state.asking = true;
    reads.set(id, state);
    try {
      const response = await fetchImpl(`${base}nbcoord/api/kernels/${encodeURIComponent(id)}/stacks`, {
        credentials: "same-origin",
        headers: { Accept: "application/json", "X-XSRFToken": xsrf() },
      });
      state.read = response.ok ? await response.json() : { available: false, reason: `the server answered ${response.status}` };
    } catch (err) {
      state.read = { available: false, reason: "the server could not be reached" };
    } finally {
      state.asking = false;
    }
    redraw();
    return state.read;
  }

  /** Read the stacks of every kernel that does not answer; forget those that answer again. @param {any[]} kernels */
  function refresh(kernels) {
    const ids = new Set();
    for (const k of kernels) {
      if (!frozen(k)) continue;
      ids.add(k.id);
      look(k.id);
    }
    for (const id of [...reads.keys()]) {
      if (!ids.has(id)) reads.delete(id);
    }
    for (const [id, outcome] of [...outcomes]) {
      if (outcome.until < performance.now()) outcomes.delete(id);
    }
  }

  /** What the row's Activity cell adds for a kernel that does not answer. @param {any} k @returns {Node[]} */
  function nodes(k) {
    const outcome = outcomes.get(k.id);
    const shown = outcome ? [h("div", `nbf-result ${outcome.error ? "nbf-error" : ""}`, outcome.text)] : [];
    if (!frozen(k)) return shown;
    const read = reads.get(k.id)?.read;
    const parts = [];
    if (read && read.available && read.main) {
      parts.push(h("div", "nbf-doing", `Main thread: ${read.main.doing}`));
      if (Array.isArray(read.deadlocks)) {
        for (const d of read.deadlocks) parts.push(h("div", "nbf-error", String(d.text)));
      }
    } else if (read && !read.available) {
      parts.push(h("div", "nbf-muted", `Stacks not read: ${read.reason}`));
    }
    const interrupt = /** @type {HTMLButtonElement} */ (h("button", "", "Interrupt"));
    interrupt.dataset.action = "interrupt";
    interrupt.title = EXPLAIN.interrupt;
    const armed = (confirming.get(k.id) || 0) > performance.now();
    const restart = /** @type {HTMLButtonElement} */ (h("button", "danger", armed ? "Click again to restart" : "Restart"));
    restart.dataset.action = "restart";
    restart.title = EXPLAIN.restart;
    parts.push(h("div", "", ""), interrupt, restart, ...shown);
    return parts;
  }

  /** A key that changes when what nodes() draws changes. @param {any} k */
  function key(k) {
    const read = reads.get(k.id)?.read;
    return JSON.stringify([frozen(k), read && read.main ? read.main.doing : read && read.reason,
      read && read.deadlocks, outcomes.get(k.id)?.text, (confirming.get(k.id) || 0) > performance.now()]);
  }

  /** @param {string} id @param {string} text @param {boolean} error */
  function say(id, text, error) {
    outcomes.set(id, { text, error, until: performance.now() + OUTCOME_MS });
    redraw();
  }

  /** @param {string} id @param {string} action */
  async function post(id, action) {
    const response = await fetchImpl(`${base}api/kernels/${encodeURIComponent(id)}/${action}`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-XSRFToken": xsrf() },
      body: "{}",
    });
    return response;
  }

  /** @param {string} id */
  async function interrupt(id) {
    const before = reads.get(id)?.read;
    say(id, "Interrupt sent…", false);
    const response = await post(id, "interrupt").catch(() => null);
    if (!response || !response.ok) {
      say(id, `Interrupt refused (${response ? response.status : "no answer"})`, true);
      return;
    }
    await new Promise((resolve) => window.setTimeout(resolve, RECHECK_MS));
    const after = await look(id);
    const same = before && before.main && after && after.main && after.main.since === before.main.since &&
      after.main.holds_gil && isNum(after.main.cell);
    if (same) say(id, "Interrupt cannot end this call (it never checks for signals); Restart will.", true);
    else say(id, "Interrupt landed: the call ended.", false);
  }

  /** @param {string} id */
  async function restart(id) {
    if ((confirming.get(id) || 0) <= performance.now()) {
      confirming.set(id, performance.now() + CONFIRM_MS);
      redraw();
      window.setTimeout(redraw, CONFIRM_MS + 50);
      return;
    }
    confirming.delete(id);
    say(id, "Restarting…", false);
    const response = await post(id, "restart").catch(() => null);
    if (response && response.ok) say(id, "Restarted: a new kernel process runs; what the old one held is gone.", false);
    else say(id, `Restart refused (${response ? response.status : "no answer"})`, true);
  }

  /** @param {string} id @param {string | undefined} action */
  function act(id, action) {
    if (action === "interrupt") interrupt(id);
    else if (action === "restart") restart(id);
  }

  return { refresh, nodes, key, act };
}
