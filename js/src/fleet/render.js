// @ts-check
/**
 * The server page's table: one row per kernel, keyed by kernel id, refreshed from the JSON API; the stop buttons.
 */

import { bytes, coarseDuration, h, isNum, plural, safe } from "../shared/text.js";
import { frozenKernels } from "./frozen.js";
import { CSS } from "./style.js";

const COLUMNS = ["Notebook", "Status", "Threads", "Cells", "GPU", "Memory", "Workers", "Activity", "Last stop", "Stop"];
const STATUS_WORDS = {
  "ok": "nbcoord",
  "no-nbcoord": "no nbcoord",
  "not-answering": "not answering",
  "dead": "dead",
  "error": "error",
};
const ATTENTION_WORDS = { zombies: "zombies", gpu: "GPU held", stuck: "stuck", dead: "dead" };
/** The scopes of a last stop the server's stop API can repeat, forced (a panel's row stop is the panel's). */
const FORCEABLE = ["all", "zombies", "cell"];

/** The server's XSRF token, from the cookie it set with the page. */
function xsrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/**
 * Replace a cell's children only when what it shows changed (keyed updates: no churn, no lost focus).
 * @param {HTMLElement} cell
 * @param {string} key
 * @param {() => Node[]} build
 */
function update(cell, key, build) {
  if (cell.dataset.key === key) return;
  cell.dataset.key = key;
  cell.replaceChildren(...build());
}

/**
 * @param {HTMLElement} root
 * @param {{ baseUrl?: string, interval?: number, fetch?: typeof fetch, kernel?: string | null }} [options]
 *   ``kernel``: show only that kernel's row (the JupyterLab extension's "Show nbcoord panel": ``?kernel=<id>``)
 * @returns {() => void} cleanup
 */
export function render(root, options = {}) {
  const base = (options.baseUrl || "/").replace(/\/?$/, "/");
  const intervalMs = Math.max(1000, (isNum(options.interval) ? /** @type {number} */ (options.interval) : 5) * 1000);
  const fetchImpl = options.fetch || window.fetch.bind(window);
  /** @type {Map<string, { tr: HTMLTableRowElement, cells: Record<string, HTMLElement> }>} */
  const rows = new Map();
  /** @type {Map<string, { text: string, error: boolean }>} */
  const results = new Map();
  /** @type {Set<string>} */
  const pending = new Set();
  let timer = 0;
  let stopped = false;
  /** @type {any} */
  let lastView = null;

  const style = h("style");
  style.textContent = CSS;
  const head = h("div", "nbf-head");
  head.append(h("h1", "", "Kernels of this server"));
  const summary = h("p", "nbf-summary nbf-muted", "Loading…");
  const table = h("table");
  const thead = h("thead");
  const headRow = h("tr");
  for (const name of COLUMNS) headRow.append(h("th", "", name));
  thead.append(headRow);
  const tbody = h("tbody");
  table.append(thead, tbody);
  const box = h("div", "nbf");
  box.append(style, head, summary, table);
  root.replaceChildren(box);

  const frozen = frozenKernels({ base, fetchImpl, xsrf: xsrfToken, redraw: () => { if (lastView) draw(lastView); } });

  /** @param {string} path */
  function api(path) {
    return `${base}nbcoord/api/${path}`;
  }

  async function refresh() {
    if (stopped) return;
    try {
      const response = await fetchImpl(api("kernels"), { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      lastView = await response.json();
      draw(lastView);
      frozen.refresh(Array.isArray(lastView.kernels) ? lastView.kernels : []);
    } catch (err) {
      summary.className = "nbf-summary nbf-error";
      summary.textContent = safe(`Could not read the kernels: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (!stopped) timer = window.setTimeout(refresh, intervalMs);
  }

  /** @param {any} view */
  function draw(view) {
    const all = Array.isArray(view.kernels) ? view.kernels : [];
    const kernels = options.kernel ? all.filter((/** @type {any} */ k) => String(k.id) === options.kernel) : all;
    const attention = kernels.filter((/** @type {any} */ k) => (k.attention || []).length).length;
    const gpu = view.gpu || {};
    const gpuText = gpu.available ? plural((gpu.devices || []).length, "GPU") : `no GPU figures (${gpu.reason || "unknown"})`;
    summary.className = "nbf-summary nbf-muted";
    summary.textContent = safe(`${plural(kernels.length, "kernel")}, ${attention} needing attention; ${gpuText}; ` +
      `view took ${isNum(view.took_ms) ? view.took_ms.toFixed(0) : "?"} ms.`);
    const seen = new Set();
    for (const kernel of kernels) {
      const id = String(kernel.id);
      seen.add(id);
      let row = rows.get(id);
      if (!row) {
        row = newRow(id);
        rows.set(id, row);
      }
      drawRow(row, kernel, view.taken_at);
      tbody.append(row.tr); // moves an existing row: the server's order, what needs attention first
    }
    for (const [id, row] of rows) {
      if (!seen.has(id)) {
        row.tr.remove();
        rows.delete(id);
        results.delete(id);
      }
    }
  }

  /** @param {string} id */
  function newRow(id) {
    const tr = /** @type {HTMLTableRowElement} */ (h("tr"));
    tr.dataset.kernelId = id;
    /** @type {Record<string, HTMLElement>} */
    const cells = {};
    for (const name of COLUMNS) {
      const td = h("td", ["Memory", "Workers"].includes(name) ? "num" : "");
      td.dataset.col = name.toLowerCase().replace(/\s+/g, "-");
      cells[name] = td;
      tr.append(td);
    }
    return { tr, cells };
  }

  /**
   * @param {{ tr: HTMLTableRowElement, cells: Record<string, HTMLElement> }} row
   * @param {any} k
   * @param {number} now
   */
  function drawRow(row, k, now) {
    const s = k.nbcoord;
    const c = row.cells;
    row.tr.dataset.status = String(k.status);
    update(c.Notebook, JSON.stringify([k.path, k.name, k.id, k.pid]), () => {
      const path = h("div", "nbf-path", k.path || "(no session)");
      const meta = h("div", "nbf-muted nbf-id", `${k.name || "?"} · ${String(k.id).slice(0, 8)}${isNum(k.pid) ? ` · pid ${k.pid}` : ""}`);
      path.title = safe(k.path || "");
      return [path, meta];
    });
    c.Status.title = k.error ? safe(k.error) : isNum(k.answer_ms) ? `nbcoord answered in ${k.answer_ms.toFixed(1)} ms` : "";
    update(c.Status, JSON.stringify([k.status, k.attention, k.error]), () => {
      const chips = [h("span", `nbf-chip ${k.status}`, STATUS_WORDS[/** @type {keyof STATUS_WORDS} */ (k.status)] || k.status)];
      for (const a of k.attention || []) {
        if (a !== "dead") chips.push(h("span", `nbf-chip ${a}`, ATTENTION_WORDS[/** @type {keyof ATTENTION_WORDS} */ (a)] || a));
      }
      const box = h("div");
      box.append(...chips);
      return k.error && k.status !== "ok" ? [box, h("div", "nbf-muted nbf-result", k.error)] : [box];
    });
    update(c.Threads, JSON.stringify(s ? [s.threads, s.zombies, s.threads_by_state, s.zombie_reasons] : null), () => {
      if (!s) return [h("span", "nbf-muted", "–")];
      const parts = [h("div", "", plural(s.threads, "thread"))];
      if (s.zombies) parts.push(h("span", "nbf-chip zombies", plural(s.zombies, "zombie")));
      const states = Object.entries(s.threads_by_state || {}).filter(([, n]) => n).map(([st, n]) => `${n} ${st}`);
      if (states.length) parts.push(h("div", "nbf-muted", states.join(", ")));
      return parts;
    });
    update(c.Cells, JSON.stringify([s ? s.cells : null, pending.has(k.id)]), () => {
      if (!s || !(s.cells || []).length) return [h("span", "nbf-muted", "–")];
      return s.cells.map((/** @type {any} */ cell) => {
        const button = h("button", cell.zombies ? "danger" : "", `Stop cell [${cell.cell}] · ${plural(cell.threads, "thread")}`);
        button.dataset.action = "stop";
        button.dataset.scope = "cell";
        button.dataset.cell = String(cell.cell);
        button.title = safe(`Stop the ${plural(cell.threads, "thread")} cell [${cell.cell}] started` +
          (cell.zombies ? ` (${plural(cell.zombies, "zombie")})` : ""));
        /** @type {HTMLButtonElement} */ (button).disabled = pending.has(k.id);
        return button;
      });
    });
    update(c.GPU, JSON.stringify(k.gpu), () => {
      const held = (k.gpu || []).map((/** @type {any} */ g) => {
        const workers = g.workers_bytes ? ` (+${bytes(g.workers_bytes, "–")} workers)` : "";
        return h("div", "", `GPU ${g.index}: ${bytes(g.bytes, "–")}${workers}`);
      });
      return held.length ? held : [h("span", "nbf-muted", "–")];
    });
    update(c.Memory, String(k.rss), () => [document.createTextNode(bytes(k.rss, "–"))]);
    update(c.Workers, String(k.worker_processes), () => [document.createTextNode(isNum(k.worker_processes) ? String(k.worker_processes) : "–")]);
    const running = s && isNum(s.running_cell) ? `cell [${s.running_cell}] running ${coarseDuration(now - s.running_since)}` : "";
    const blocked = s && s.blocked_runs ? `${plural(s.blocked_runs, "blocked run")}, longest ${coarseDuration(s.blocked_seconds)}` : "";
    update(c.Activity, JSON.stringify([k.execution_state, running, blocked, s && s.blocked, frozen.key(k)]), () => {
      const parts = [h("div", "", running || k.execution_state || ""), ...frozen.nodes(k)];
      if (blocked) {
        const b = h("div", "nbf-chip stuck", blocked);
        b.title = (s.blocked || []).map((/** @type {any} */ r) => safe(r.text || r.thread)).join("\n");
        parts.push(b);
      }
      return parts;
    });
    const last = s && s.last_stop;
    const when = last && isNum(last.started_at) ? `${coarseDuration(now - last.started_at)} ago` : "";
    // The age is part of the key: it moves on with every refresh, as the panel's does.
    update(c["Last stop"], JSON.stringify([last, when, k.status, pending.has(k.id)]), () => {
      if (!last) return [h("span", "nbf-muted", "–")];
      const text = `${last.scope}${last.cell !== null && last.cell !== undefined ? ` [${last.cell}]` : ""}: ` +
        `${last.stopped} stopped${last.alive ? `, ${last.alive} alive` : ""} ${when}`;
      const node = h("div", last.alive ? "nbf-error" : "", text);
      if (last.alive_names && last.alive_names.length) node.title = `still alive: ${last.alive_names.map((/** @type {unknown} */ n) => safe(n)).join(", ")}`;
      return last.alive && FORCEABLE.includes(last.scope) ? [node, forceButton(k, last)] : [node];
    });
    const result = results.get(k.id);
    update(c.Stop, JSON.stringify([k.status, s ? s.zombies : null, pending.has(k.id), result]), () => {
      const can = k.status === "ok" && !pending.has(k.id);
      const zombies = h("button", "danger", pending.has(k.id) ? "Stopping…" : "Stop zombies");
      zombies.dataset.action = "stop";
      zombies.dataset.scope = "zombies";
      /** @type {HTMLButtonElement} */ (zombies).disabled = !can || !(s && s.zombies);
      const all = h("button", "", "Stop all");
      all.dataset.action = "stop";
      all.dataset.scope = "all";
      all.title = "Stop every thread the kernel's cells started (never the kernel's own)";
      /** @type {HTMLButtonElement} */ (all).disabled = !can;
      const parts = [zombies, all];
      if (result) parts.push(h("div", `nbf-result ${result.error ? "nbf-error" : ""}`, result.text));
      return parts;
    });
  }

  /**
   * The way out for threads that ignored the last stop: the same stop again, forced (ThreadStopped is raised in
   * those still running Python code).
   * @param {any} k
   * @param {any} last
   */
  function forceButton(k, last) {
    const button = /** @type {HTMLButtonElement} */ (h("button", "danger", pending.has(k.id) ? "Forcing…" : "Force stop"));
    button.dataset.action = "stop";
    button.dataset.scope = String(last.scope);
    button.dataset.force = "true";
    if (last.scope === "cell") button.dataset.cell = String(last.cell);
    button.title = safe(`Raise ThreadStopped in the ${plural(last.alive, "thread")} that ignored the stop ` +
      "(a thread inside a C call ends when the call returns)");
    button.disabled = k.status !== "ok" || pending.has(k.id);
    return button;
  }

  /**
   * @param {string} id
   * @param {Record<string, unknown>} body
   */
  async function stop(id, body) {
    pending.add(id);
    results.delete(id);
    if (lastView) draw(lastView);
    try {
      const response = await fetchImpl(api(`kernels/${encodeURIComponent(id)}/stop`), {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-XSRFToken": xsrfToken() },
        body: JSON.stringify(body),
      });
      const reply = await response.json().catch(() => ({}));
      if (!response.ok) {
        results.set(id, { text: `Refused (${response.status}): ${reply.message || response.statusText}`, error: true });
      } else {
        const report = reply.report || {};
        const alive = report.alive || [];
        const names = alive.slice(0, 3).map((/** @type {any} */ a) => a.name).join(", ");
        const text = `Stopped ${plural((report.stopped || []).length, "thread")}` +
          (alive.length ? `; still alive: ${names}${alive.length > 3 ? "…" : ""}` : "") +
          (isNum(report.took_s) ? ` in ${(report.took_s * 1000).toFixed(0)} ms` : "");
        results.set(id, { text, error: alive.length > 0 });
      }
    } catch (err) {
      results.set(id, { text: `Failed: ${err instanceof Error ? err.message : String(err)}`, error: true });
    } finally {
      pending.delete(id);
    }
    window.clearTimeout(timer);
    await refresh();
  }

  /** @param {Event} event */
  function onClick(event) {
    const way = event.target instanceof Element ? event.target.closest("button[data-action='interrupt'], button[data-action='restart']") : null;
    const wayRow = way ? way.closest("tr[data-kernel-id]") : null;
    if (way && wayRow && box.contains(wayRow)) {
      frozen.act(String(/** @type {HTMLElement} */ (wayRow).dataset.kernelId), /** @type {HTMLElement} */ (way).dataset.action);
      return;
    }
    const target = event.target instanceof Element ? event.target.closest("button[data-action='stop']") : null;
    const tr = target ? target.closest("tr[data-kernel-id]") : null;
    if (!target || !tr || !box.contains(tr)) return;
    const button = /** @type {HTMLButtonElement} */ (target);
    const id = String(/** @type {HTMLElement} */ (tr).dataset.kernelId);
    if (button.disabled || pending.has(id)) return;
    /** @type {Record<string, unknown>} */
    const body = { scope: button.dataset.scope };
    if (button.dataset.scope === "cell") body.cell = Number(button.dataset.cell);
    if (button.dataset.force === "true") body.force = true;
    stop(id, body);
  }

  box.addEventListener("click", onClick);
  refresh();

  return () => {
    stopped = true;
    window.clearTimeout(timer);
    box.removeEventListener("click", onClick);
    box.remove();
  };
}
