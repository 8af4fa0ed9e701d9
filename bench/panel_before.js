// @ts-check
/**
 * nbcoord's live panel: the front end of nbcoord.ui.panel.NBCoordPanel (anywidget).
 *
 * State arrives in traits set by the kernel (header, threads, cells, queues, blocked, resources, failures,
 * history, last_stop, stack, clock, beat); this module only draws it and sends commands (stop, stack, view),
 * each with a click id. Every name from the kernel is set with textContent: nothing from the kernel is ever
 * parsed as HTML. Bars and sparklines are inline SVG, colours come from JupyterLab's --jp-* variables.
 *
 * Figures that move on their own (idle times, "n s ago") are computed here from the kernel's timestamps,
 * corrected for clock skew by the kernel's clock, echoed once per view ("clock" trait). While a cell runs, the
 * kernel sends a beat every interval; when beats stop, the main thread holds the GIL in native code, and the
 * panel says so.
 */

const SVG_NS = "http://www.w3.org/2000/svg";
/** The kernel forgets a view that has not renewed for 60 s (nbcoord.ui.panel.VIEW_LEASE_S). */
const RENEW_MS = 20000;
const TICK_MS = 1000;
const MAX_ROWS_PER_GROUP = 200;
const MAX_BLOCKED = 3;
const HISTORY_WINDOW_S = 600;
const TRAITS = [
  "header", "threads", "cells", "queues", "blocked", "resources", "failures",
  "history", "last_stop", "stack", "clock", "beat", "_fast_route",
];
const ZOMBIE_WORDS = {
  "cell-interrupted": "its cell was interrupted",
  "cell-error": "its cell raised an error",
  "stop-ignored": "it ignored a stop request",
  "owner-closed": "its owner is closed",
};
/** Short forms for the row; the row's tooltip has the sentence. */
const ZOMBIE_SHORT = {
  "cell-interrupted": "cell interrupted",
  "cell-error": "cell failed",
  "stop-ignored": "ignored stop",
  "owner-closed": "owner closed",
};

const CSS = `
.nbc { font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: var(--jp-ui-font-size1, 13px);
  color: var(--jp-ui-font-color1, #1f1f1f); background: var(--jp-layout-color1, #fff);
  border: 1px solid var(--jp-border-color2, #e0e0e0); border-radius: 4px; padding: 6px 10px 8px;
  line-height: 1.4; max-width: 1000px; box-sizing: border-box; }
.nbc * { box-sizing: border-box; }
.nbc-head { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 12px; }
.nbc-title { font-weight: 600; letter-spacing: .02em; }
.nbc-muted { color: var(--jp-ui-font-color2, #616161); }
.nbc-small { font-size: var(--jp-ui-font-size0, 11px); }
.nbc-code { font-family: var(--jp-code-font-family, monospace); font-size: var(--jp-code-font-size, 12px); }
.nbc-fig { display: inline-flex; align-items: center; gap: 5px; white-space: nowrap; }
.nbc-fig b { font-weight: 600; }
.nbc-spacer { flex: 1 1 auto; }
.nbc-chip { display: inline-block; border-radius: 9px; padding: 0 7px; white-space: nowrap;
  font-size: var(--jp-ui-font-size0, 11px); background: var(--jp-layout-color2, #eee);
  color: var(--jp-ui-font-color1, #1f1f1f); }
.nbc-chip.err { background: var(--jp-error-color1, #d32f2f); color: var(--jp-ui-inverse-font-color1, #fff); }
.nbc-chip.warn { background: transparent; box-shadow: inset 0 0 0 1px var(--jp-warn-color1, #f57c00);
  color: var(--jp-warn-color1, #f57c00); }
.nbc-chip.ok { background: transparent; box-shadow: inset 0 0 0 1px var(--jp-success-color1, #388e3c);
  color: var(--jp-success-color1, #388e3c); }
.nbc-btn { font: inherit; font-size: var(--jp-ui-font-size0, 11px); line-height: 1.5; cursor: pointer;
  color: var(--jp-ui-font-color1, #1f1f1f); background: var(--jp-layout-color2, #eee);
  border: 1px solid var(--jp-border-color1, #bdbdbd); border-radius: 3px; padding: 0 8px; }
.nbc-btn:hover { background: var(--jp-layout-color3, #ddd); }
.nbc-btn.danger { background: var(--jp-error-color1, #d32f2f); border-color: var(--jp-error-color1, #d32f2f);
  color: var(--jp-ui-inverse-font-color1, #fff); font-weight: 600; font-size: var(--jp-ui-font-size1, 13px);
  padding: 1px 12px; }
.nbc-btn.danger:hover { background: var(--jp-error-color0, #b71c1c); }
.nbc-btn.busy { opacity: .75; cursor: progress; }
.nbc-row .nbc-btn { background: transparent; border-color: transparent; color: var(--jp-ui-font-color2, #616161); }
.nbc-row:hover .nbc-btn, .nbc-row .nbc-btn:focus { border-color: var(--jp-border-color1, #bdbdbd);
  background: var(--jp-layout-color1, #fff); color: var(--jp-ui-font-color1, #1f1f1f); }
.nbc-status { margin-top: 3px; }
.nbc-banner { margin-top: 4px; padding: 3px 8px; border-left: 3px solid var(--jp-warn-color1, #f57c00);
  background: var(--jp-warn-color3, #fff3e0); color: var(--jp-ui-font-color0, #000); }
.nbc-sec { margin-top: 7px; padding-top: 5px; border-top: 1px solid var(--jp-border-color2, #e0e0e0); }
.nbc-sec-title { font-weight: 600; margin-bottom: 3px; display: flex; gap: 8px; align-items: baseline; }
.nbc-scroll { max-height: 22em; overflow-y: auto; }
.nbc-group { margin: 2px 0 4px; }
.nbc-ghead { display: flex; align-items: center; gap: 8px; cursor: pointer; padding: 1px 2px;
  border-radius: 3px; }
.nbc-ghead:hover { background: var(--jp-layout-color2, #f3f3f3); }
.nbc-caret { width: 1em; display: inline-block; color: var(--jp-ui-font-color2, #616161); }
.nbc-line { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; max-width: 32em; }
.nbc-row { display: grid; grid-template-columns: 10px minmax(10em, 20em) 3em minmax(8em, 1fr) 7em 4.5em auto;
  align-items: center; gap: 8px; padding: 1px 2px 1px 18px; border-left: 3px solid transparent; }
.nbc-row:hover { background: var(--jp-layout-color2, #f5f5f5); }
.nbc-row.zombie { border-left-color: var(--jp-error-color1, #d32f2f); }
.nbc-name { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nbc-dot { width: 9px; height: 9px; border-radius: 50%; background: var(--jp-ui-font-color3, #bdbdbd); }
.nbc-dot.running { background: var(--jp-success-color1, #388e3c); }
.nbc-dot.waiting { background: var(--jp-brand-color1, #1976d2); }
.nbc-dot.stopping { background: var(--jp-warn-color1, #f57c00); }
.nbc-dot.zombie { background: var(--jp-error-color1, #d32f2f); }
.nbc-info { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nbc-actions { display: flex; gap: 4px; justify-content: flex-end; }
.nbc-why { color: var(--jp-error-color1, #d32f2f); }
.nbc-pre { margin: 2px 0 4px 30px; padding: 4px 6px; max-height: 16em; overflow: auto; white-space: pre;
  background: var(--jp-layout-color2, #f5f5f5); border-radius: 3px; font-family: var(--jp-code-font-family, monospace);
  font-size: var(--jp-code-font-size, 12px); }
.nbc-q { display: grid; grid-template-columns: minmax(8em, 14em) 120px 7em minmax(8em, 1fr) 124px; gap: 10px;
  align-items: center; padding: 1px 2px; }
.nbc-mem { display: grid; grid-template-columns: minmax(7em, 11em) 120px minmax(10em, 1fr) 124px; gap: 10px;
  align-items: center; padding: 1px 2px; }
.nbc-bar-bg { fill: var(--jp-layout-color3, #e0e0e0); }
.nbc-bar { fill: var(--jp-brand-color1, #1976d2); }
.nbc-bar.warn { fill: var(--jp-warn-color1, #f57c00); }
.nbc-bar.err { fill: var(--jp-error-color1, #d32f2f); }
.nbc-spark { fill: none; stroke: var(--jp-brand-color1, #1976d2); stroke-width: 1.3; }
.nbc-spark-area { fill: var(--jp-brand-color3, #bbdefb); opacity: .6; stroke: none; }
.nbc-spark-base { stroke: var(--jp-border-color2, #e0e0e0); stroke-width: 1; }
.nbc-sentence { padding: 1px 2px; }
.nbc-sentence::before { content: "\\26A0\\FE0E  "; color: var(--jp-warn-color1, #f57c00); }
.nbc-kids { margin-left: 18px; }
`;

/**
 * A DOM element; ``text`` is set as text, never parsed.
 * @param {string} tag
 * @param {string} [cls]
 * @param {unknown} [text]
 * @returns {HTMLElement}
 */
function h(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

/**
 * @param {string} tag
 * @param {Record<string, string | number>} attrs
 * @returns {SVGElement}
 */
function s(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

/**
 * The URL of nbcoord's server page (every kernel of this Jupyter server), from the page's Jupyter config
 * (JupyterLab, Notebook 7); null where there is none (VS Code).
 * @returns {string | null}
 */
function fleetUrl() {
  const node = document.getElementById("jupyter-config-data");
  if (!node) return null;
  try {
    const base = JSON.parse(node.textContent || "{}").baseUrl;
    return typeof base === "string" ? `${base.replace(/\/?$/, "/")}nbcoord/` : null;
  } catch (err) {
    return null;
  }
}

/** @param {unknown} n */
function isNum(n) {
  return typeof n === "number" && Number.isFinite(n);
}

/** @param {unknown} n */
function bytes(n) {
  if (!isNum(n)) return "n/a";
  let v = /** @type {number} */ (n);
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (Math.abs(v) < 1024) return unit === "B" ? `${v.toFixed(0)} ${unit}` : `${v.toFixed(1)} ${unit}`;
    v /= 1024;
  }
  return `${v.toFixed(1)} TiB`;
}

/** @param {number} secs */
function duration(secs) {
  const v = Math.max(0, secs);
  if (v < 60) return `${Math.floor(v)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min ${Math.floor(v % 60)} s`;
  return `${Math.floor(v / 3600)} h ${Math.floor((v % 3600) / 60)} min`;
}

/** @param {number} n @param {string} one @param {string} [many] */
function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many || `${one}s`}`;
}

/**
 * A horizontal bar: ``fraction`` of ``width`` filled; warn and error colours near full.
 * @param {number | null} fraction
 * @param {string} label for screen readers and the tooltip
 * @param {number} [width]
 * @param {number} [height]
 * @param {boolean} [alarm] colour a nearly full bar (memory); a full queue is not an alarm by itself
 */
function bar(fraction, label, width = 120, height = 9, alarm = true) {
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  svg.setAttribute("aria-label", label);
  const title = s("title", {});
  title.textContent = label;
  svg.appendChild(title);
  svg.appendChild(s("rect", { class: "nbc-bar-bg", x: 0, y: 0, width, height, rx: 2 }));
  if (fraction !== null && isNum(fraction)) {
    const f = Math.max(0, Math.min(1, fraction));
    const cls = !alarm ? "nbc-bar" : f >= 0.9 ? "nbc-bar err" : f >= 0.75 ? "nbc-bar warn" : "nbc-bar";
    svg.appendChild(s("rect", { class: cls, x: 0, y: 0, width: (width * f).toFixed(1), height, rx: 2 }));
  }
  return svg;
}

/**
 * A step sparkline of ``[t, ...values]`` change points, column ``col``, over the last window ending at ``now``.
 * @param {Array<Array<number | null>>} points
 * @param {number} col
 * @param {number} now kernel time, seconds
 * @param {number | null} top the value drawn at full height (null: the series' maximum)
 * @param {string} label
 */
function sparkline(points, col, now, top, label, width = 120, height = 22) {
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "nbc-sparksvg" });
  svg.setAttribute("aria-label", label);
  const title = s("title", {});
  title.textContent = label;
  svg.appendChild(title);
  svg.appendChild(s("line", { class: "nbc-spark-base", x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5 }));
  const usable = (points || []).filter((p) => Array.isArray(p) && isNum(p[0]) && isNum(p[col]));
  if (!usable.length) return svg;
  const start = now - HISTORY_WINDOW_S;
  const first = Math.max(start, Math.min(/** @type {number} */ (usable[0][0]), now));
  const span = Math.max(1, now - first);
  const max = top && top > 0 ? top : Math.max(1, ...usable.map((p) => /** @type {number} */ (p[col])));
  const x = (/** @type {number} */ t) => ((Math.max(t, first) - first) / span) * (width - 1);
  const y = (/** @type {number} */ v) => height - 1 - (Math.min(v, max) / max) * (height - 3);
  let d = "";
  usable.forEach((p, i) => {
    const px = x(/** @type {number} */ (p[0])).toFixed(1);
    const py = y(/** @type {number} */ (p[col])).toFixed(1);
    d += i === 0 ? `M${px} ${py}` : `H${px}V${py}`;
  });
  d += `H${(width - 1).toFixed(1)}`;
  svg.appendChild(s("path", { class: "nbc-spark-area", d: `${d}V${height - 1}H${x(first).toFixed(1)}Z` }));
  svg.appendChild(s("path", { class: "nbc-spark", d }));
  return svg;
}

/**
 * Send a command so that it is handled while a cell is busy.
 *
 * The ordinary ``model.send`` always goes (any front end; handled when the main thread is free). When the
 * kernel's fast route is "control" (ipykernel 6), the same command also goes as a comm_msg on the control
 * channel, which ipykernel 6 reads off the main thread. On "shell-channel" (ipykernel 7) the kernel copies the
 * ordinary message itself. The kernel acts on the first copy and drops the other by its click id.
 * @param {any} model
 * @param {Record<string, unknown>} content
 */
export function sendCommand(model, content) {
  /** @type {{kind?: string, comm_id?: string} | null} */
  const route = model.get("_fast_route");
  if (route && route.kind === "control" && typeof route.comm_id === "string") {
    sendOnControl(model, route.comm_id, content);
  }
  model.send(content);
}

/**
 * @param {any} model
 * @param {string} commId
 * @param {Record<string, unknown>} content
 * @returns {boolean} whether the control-channel message was sent
 */
function sendOnControl(model, commId, content) {
  // The @jupyterlab/services kernel connection (JupyterLab 4, Notebook 7); other front ends (VS Code, Colab)
  // may not expose it: the ordinary message then does the job, late.
  const kernel = model.widget_manager && model.widget_manager.kernel;
  if (!kernel || typeof kernel.sendControlMessage !== "function") return false;
  const msgId = globalThis.crypto && typeof crypto.randomUUID === "function"
    ? crypto.randomUUID()
    : `nbcoord-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
  const msg = {
    channel: "control",
    header: {
      msg_id: msgId,
      msg_type: "comm_msg",
      username: kernel.username || "",
      session: kernel.clientId || "",
      date: new Date().toISOString(),
      version: "5.3",
    },
    parent_header: {},
    metadata: {},
    content: { comm_id: commId, data: { method: "custom", content } },
    buffers: [],
  };
  try {
    // expectReply=false: comm_msg has no reply; the future ends on the kernel's idle status.
    const future = kernel.sendControlMessage(msg, false, true);
    if (future && future.done) future.done.catch(() => {});
    return true;
  } catch (err) {
    console.warn("nbcoord: control-channel send failed", err);
    return false;
  }
}

/** A per-view random id: commands carry `${viewId}-${n}` as their click id. */
function newViewId() {
  return `v${Math.random().toString(36).slice(2, 10)}${Date.now().toString(36)}`;
}

/**
 * @param {{ model: any, el: HTMLElement }} ctx
 * @returns {() => void} cleanup
 */
function render({ model, el }) {
  const viewId = newViewId();
  let clicks = 0;
  /** Per-view UI state, kept across redraws. */
  const ui = {
    closedGroups: new Set(["kernel"]),
    stacks: new Set(),
    tracebacks: new Set(),
    /** @type {{click_id: string, at: number} | null} */
    pending: null,
    offsetMs: 0,
    lastUpdate: performance.now(),
    /** @type {string | null} nbcoord's server page, once the server says it is there */
    fleet: null,
  };

  const root = h("div", "nbc");
  root.setAttribute("data-nbcoord", "panel");
  const style = h("style");
  style.textContent = CSS;
  const head = h("div", "nbc-head");
  const status = h("div", "nbc-status nbc-small nbc-muted");
  const banner = h("div", "nbc-banner");
  banner.setAttribute("role", "status");
  banner.hidden = true;
  const body = h("div", "nbc-body");
  root.append(style, head, status, banner, body);
  el.appendChild(root);

  /** @param {string} name */
  const get = (name) => model.get(name);
  const kernelNow = () => (Date.now() + ui.offsetMs) / 1000;
  const nextClickId = () => `${viewId}-${++clicks}`;

  /** @param {Record<string, unknown>} command */
  function send(command) {
    const content = { ...command, click_id: nextClickId() };
    sendCommand(model, content);
    return /** @type {string} */ (content.click_id);
  }

  /** @param {Record<string, unknown>} scope */
  function stop(scope) {
    const clickId = send({ type: "stop", ...scope, clicked_at: Date.now() });
    ui.pending = { click_id: clickId, at: performance.now() };
    schedule();
  }

  // ------------------------------------------------------------------------------------------- drawing
  function drawHead() {
    const header = get("header") || {};
    const res = get("resources");
    const items = [h("span", "nbc-title", "nbcoord")];
    if (isNum(header.pid)) items.push(h("span", "nbc-muted", `kernel ${header.pid}`));
    const fig = (/** @type {string} */ text, /** @type {string} */ cls) => h("span", `nbc-fig ${cls || ""}`, text);
    if (isNum(header.threads)) items.push(fig(plural(header.threads, "thread"), ""));
    if (isNum(header.zombies)) {
      const z = h("span", `nbc-chip ${header.zombies ? "err" : "ok"}`, plural(header.zombies, "zombie"));
      items.push(z);
    }
    if (isNum(header.queues) && header.queues) items.push(fig(plural(header.queues, "queue"), ""));
    if (res && res.host && isNum(res.host.rss)) {
      const host = res.host;
      const mem = h("span", "nbc-fig");
      mem.append(h("span", "nbc-muted", "RAM"), h("b", "", bytes(host.rss)));
      if (isNum(host.total) && host.total > 0) {
        mem.append(bar(host.rss / host.total, `kernel RSS ${bytes(host.rss)} of ${bytes(host.total)}`, 60, 8));
      }
      items.push(mem);
    }
    const devices = (res && res.gpu && res.gpu.devices) || [];
    for (const dev of devices) {
      const g = h("span", "nbc-fig");
      g.append(h("span", "nbc-muted", `GPU${devices.length > 1 ? ` ${dev.index}` : ""}`),
        h("b", "", `${bytes(dev.used)} / ${bytes(dev.total)}`));
      if (isNum(dev.used) && isNum(dev.total) && dev.total > 0) {
        g.append(bar(dev.used / dev.total, `GPU ${dev.index} ${bytes(dev.used)} of ${bytes(dev.total)}`, 60, 8));
      }
      items.push(g);
    }
    items.push(h("span", "nbc-spacer"));
    if (ui.fleet) {
      const link = /** @type {HTMLAnchorElement} */ (h("a", "nbc-small", "All kernels ↗"));
      link.href = ui.fleet;
      link.target = "_blank";
      link.rel = "noopener";
      link.title = "Every kernel of this Jupyter server: zombies, GPU memory, stuck kernels (nbcoord's server page)";
      items.push(link);
    }
    const button = h("button", "nbc-btn danger", ui.pending ? "Stopping…" : "Stop all");
    button.dataset.action = "stop-all";
    button.title = "Stop every thread started since nbcoord was loaded (works while a cell is busy)";
    if (ui.pending) button.classList.add("busy");
    items.push(button);
    head.replaceChildren(...items);
  }

  function drawStatus() {
    const header = get("header") || {};
    const now = kernelNow();
    const parts = [];
    if (isNum(header.running_cell)) {
      const since = isNum(header.running_since) ? ` for ${duration(now - header.running_since)}` : "";
      parts.push(`cell [${header.running_cell}] running${since}`);
    } else if (header.pid !== undefined) {
      parts.push("kernel idle");
    }
    if (isNum(header.kernel_threads)) parts.push(`${plural(header.kernel_threads, "kernel thread")} not shown`);
    if (header.route === "none") parts.push("no fast route: Stop acts when the running cell ends");
    status.textContent = parts.join(" · ");
    const beat = get("beat");
    const every = beat && isNum(beat.every) ? beat.every : isNum(header.interval) ? header.interval : 1;
    const interval = every * 1000;
    const limit = 3 * interval + 1000;
    const silent = performance.now() - ui.lastUpdate;
    const waiting = ui.pending !== null && performance.now() - ui.pending.at > limit;
    // Silence is normal when no cell runs and nothing was asked; otherwise no update means no Python runs.
    let text = "";
    if (silent > limit && (isNum(header.running_cell) || waiting)) {
      text = `Kernel busy in native code (no update for ${duration(silent / 1000)}); stop will act when it returns.`;
    } else if (waiting && header.route === "none" && isNum(header.running_cell)) {
      text = `Stop will act when cell [${header.running_cell}] ends (no fast route for this kernel).`;
    }
    banner.hidden = !text;
    banner.textContent = text;
  }

  /** @param {Record<string, any>} row @param {number} now */
  function threadRow(row, now) {
    const line = h("div", `nbc-row${row.zombie ? " zombie" : ""}`);
    line.dataset.tid = String(row.tid);
    const dot = h("span", `nbc-dot ${row.zombie ? "zombie" : row.state}`);
    dot.title = String(row.state);
    const name = h("span", "nbc-name nbc-code", row.name);
    name.title = String(row.name);
    const tid = h("span", "nbc-muted nbc-small", row.tid);
    const infoParts = [];
    const zombie = /** @type {keyof ZOMBIE_WORDS} */ (row.zombie);
    if (row.zombie) infoParts.push(`zombie: ${ZOMBIE_SHORT[zombie] || row.zombie}`);
    if (row.owners && row.owners.length) {
      infoParts.push(row.owners.map((/** @type {any} */ o) => `${o.label}${o.closed ? " (closed)" : ""}`).join(", "));
    }
    if (!row.daemon) infoParts.push("non-daemon");
    if (row.last_exception) infoParts.push(`last error: ${row.last_exception}`);
    const info = h("span", `nbc-info nbc-small ${row.zombie ? "nbc-why" : "nbc-muted"}`, infoParts.join(" · "));
    info.title = [row.zombie ? `zombie: ${ZOMBIE_WORDS[zombie] || row.zombie}` : "", ...infoParts.slice(row.zombie ? 1 : 0)]
      .filter(Boolean).join("\n");
    // last_active is null while the thread is active; else its idle period's start, in kernel time.
    const idle = h("span", "nbc-small nbc-muted", row.state === "stopping" ? "stopping" : "active");
    if (isNum(row.last_active)) {
      idle.dataset.since = String(row.last_active);
      idle.textContent = idleText(now - row.last_active, row.state);
    }
    const cpu = h("span", "nbc-small nbc-muted", isNum(row.cpu_s) && row.cpu_s >= 0.05 ? `cpu ${cpuText(row.cpu_s)}` : "");
    const actions = h("span", "nbc-actions");
    const stackBtn = h("button", "nbc-btn", ui.stacks.has(row.tid) ? "hide stack" : "stack");
    stackBtn.dataset.action = "stack";
    stackBtn.dataset.tid = String(row.tid);
    const stopBtn = h("button", "nbc-btn", "stop");
    stopBtn.dataset.action = "stop-thread";
    stopBtn.dataset.tid = String(row.tid);
    stopBtn.title = `Stop this thread (${row.tid})`;
    actions.append(stackBtn, stopBtn);
    line.append(dot, name, tid, info, idle, cpu, actions);
    const out = [line];
    if (ui.stacks.has(row.tid)) out.push(stackBlock(row.tid));
    return out;
  }

  /**
   * A blocked run's sentence; the kernel leaves the growing duration as "{duration}", drawn here from since.
   * @param {{text: string, since?: number}} b @param {number} now
   */
  function blockedText(b, now) {
    return isNum(b.since) ? b.text.replace("{duration}", `${Math.max(0, now - /** @type {number} */ (b.since)).toFixed(1)} s`) : b.text;
  }

  /** @param {number} secs */
  function cpuText(secs) {
    return secs < 10 ? `${secs.toFixed(1)} s` : `${Math.round(secs)} s`;
  }

  /** @param {number} idle @param {string} state */
  function idleText(idle, state) {
    if (state === "stopping") return "stopping";
    return idle >= 2 ? `idle ${duration(idle)}` : "active";
  }

  /** @param {string} tid */
  function stackBlock(tid) {
    const stack = get("stack");
    if (!stack || stack.tid !== tid) return h("div", "nbc-pre nbc-muted", "asking the kernel for the stack…");
    const lines = [];
    lines.push("Current stack (innermost last):");
    lines.push(...(stack.stack && stack.stack.length ? stack.stack.map((/** @type {string} */ l) => `  ${l}`)
      : ["  (not running Python code)"]));
    if (stack.creation && stack.creation.length) {
      lines.push("Started from (innermost first):");
      lines.push(...stack.creation.map((/** @type {string} */ l) => `  ${l}`));
    }
    return h("div", "nbc-pre", lines.join("\n"));
  }

  function drawThreads() {
    const rows = get("threads") || [];
    const header = get("header") || {};
    const cells = new Map((get("cells") || []).map((/** @type {any} */ c) => [c.n, c]));
    const now = kernelNow();
    const sec = h("div", "nbc-sec");
    const title = h("div", "nbc-sec-title");
    title.append(h("span", "", "Threads"));
    if (isNum(header.threads) && header.threads > rows.length) {
      title.append(h("span", "nbc-muted nbc-small", `showing ${rows.length} of ${header.threads}`));
    }
    sec.appendChild(title);
    if (!rows.length) {
      sec.appendChild(h("div", "nbc-muted nbc-small", "No threads started since nbcoord was loaded."));
      return sec;
    }
    /** @type {Map<string, {key: string, cell: number | null, rows: any[]}>} */
    const groups = new Map();
    for (const row of rows) {
      const key = row.zombie ? "zombies" : row.cell === null || row.cell === undefined ? "none" : `c${row.cell}`;
      if (!groups.has(key)) groups.set(key, { key, cell: row.zombie ? null : row.cell, rows: [] });
      /** @type {any} */ (groups.get(key)).rows.push(row);
    }
    const order = [...groups.values()].sort((a, b) => rank(a) - rank(b));
    const scroll = h("div", "nbc-scroll");
    scroll.dataset.scroll = "threads";
    for (const group of order) scroll.appendChild(threadGroup(group, cells, now));
    sec.appendChild(scroll);
    return sec;
  }

  /** @param {{key: string, cell: number | null}} g */
  function rank(g) {
    if (g.key === "zombies") return -1;
    if (g.key === "none") return 1e12;
    return /** @type {number} */ (g.cell);
  }

  /**
   * @param {{key: string, cell: number | null, rows: any[]}} group
   * @param {Map<number, any>} cells
   * @param {number} now
   */
  function threadGroup(group, cells, now) {
    const box = h("div", "nbc-group");
    const ghead = h("div", "nbc-ghead");
    ghead.dataset.action = "toggle-group";
    ghead.dataset.group = group.key;
    const closed = ui.closedGroups.has(group.key);
    ghead.appendChild(h("span", "nbc-caret", closed ? "▸" : "▾"));
    if (group.key === "zombies") {
      ghead.append(h("span", "nbc-chip err", "Zombies"), h("span", "nbc-muted nbc-small", plural(group.rows.length, "thread")));
    } else if (group.key === "none") {
      ghead.append(h("b", "", "Not started by a cell"), h("span", "nbc-muted nbc-small", plural(group.rows.length, "thread")));
    } else {
      const cell = cells.get(/** @type {number} */ (group.cell));
      ghead.appendChild(h("b", "", `Cell [${group.cell}]`));
      if (cell) {
        const cls = cell.outcome === "error" || cell.outcome === "interrupted" ? "err" : cell.outcome === "running" ? "warn" : "";
        ghead.appendChild(h("span", `nbc-chip ${cls}`, cell.outcome));
        const code = h("span", "nbc-code nbc-muted nbc-line", cell.line);
        code.title = String(cell.line);
        ghead.appendChild(code);
      }
      ghead.appendChild(h("span", "nbc-muted nbc-small", plural(group.rows.length, "thread")));
    }
    ghead.appendChild(h("span", "nbc-spacer"));
    const stopBtn = h("button", "nbc-btn", group.key === "zombies" ? "stop zombies" : group.key === "none" ? "" : "stop cell");
    if (group.key === "zombies") {
      stopBtn.dataset.action = "stop-zombies";
      ghead.appendChild(stopBtn);
    } else if (group.key !== "none") {
      stopBtn.dataset.action = "stop-cell";
      stopBtn.dataset.cell = String(group.cell);
      stopBtn.title = `Stop the threads cell [${group.cell}] started`;
      ghead.appendChild(stopBtn);
    }
    box.appendChild(ghead);
    if (!closed) {
      for (const row of group.rows.slice(0, MAX_ROWS_PER_GROUP)) box.append(...threadRow(row, now));
      if (group.rows.length > MAX_ROWS_PER_GROUP) {
        box.appendChild(h("div", "nbc-muted nbc-small nbc-kids", `… and ${group.rows.length - MAX_ROWS_PER_GROUP} more`));
      }
    }
    return box;
  }

  function drawQueues() {
    const queues = get("queues") || [];
    const blocked = get("blocked") || [];
    if (!queues.length && !blocked.length) return null;
    const history = (get("history") || {}).queues || {};
    const now = kernelNow();
    const sec = h("div", "nbc-sec");
    sec.appendChild(h("div", "nbc-sec-title", "Queues"));
    const shownBlocked = blocked.filter((/** @type {any} */ b) => b && typeof b.text === "string");
    for (const b of shownBlocked.slice(0, MAX_BLOCKED)) {
      const line = h("div", "nbc-sentence", blockedText(b, now));
      if (isNum(b.since) && b.text.includes("{duration}")) line.dataset.blocked = JSON.stringify([b.text, b.since]);
      sec.appendChild(line);
    }
    if (shownBlocked.length > MAX_BLOCKED) {
      sec.appendChild(h("div", "nbc-small nbc-muted nbc-kids", `… and ${shownBlocked.length - MAX_BLOCKED} more blocked runs`));
    }
    for (const q of queues) {
      const row = h("div", "nbc-q");
      const name = h("span", "nbc-name nbc-code", q.name);
      name.title = String(q.name);
      const bounded = isNum(q.capacity) && q.capacity > 0;
      const size = isNum(q.size) ? q.size : null;
      const fill = bounded && size !== null ? size / q.capacity : null;
      const barBox = bar(fill, bounded ? `${size ?? "?"} of ${q.capacity}` : `${size ?? "?"} (unbounded)`, 120, 9, false);
      const level = h("span", "nbc-small", bounded ? `${size ?? "?"} / ${q.capacity}` : `${size ?? "?"} (unbounded)`);
      const parts = [];
      if (q.closed) parts.push("closed");
      if (isNum(q.enqueue_rate) || isNum(q.dequeue_rate)) {
        parts.push(`in ${(q.enqueue_rate || 0).toFixed(1)}/s · out ${(q.dequeue_rate || 0).toFixed(1)}/s`);
      }
      const runners = Array.isArray(q.runners) ? q.runners.length : isNum(q.runners) ? q.runners : null;
      if (runners !== null) parts.push(plural(runners, "runner"));
      const info = h("span", `nbc-small ${q.closed ? "nbc-why" : "nbc-muted"}`, parts.join(" · "));
      const points = history[String(q.id ?? q.name)] || [];
      const spark = sparkline(points, 1, now, bounded ? q.capacity : null, `${q.name}: fill level, last minutes`);
      row.append(name, barBox, level, info, spark);
      sec.appendChild(row);
    }
    return sec;
  }

  function drawMemory() {
    const res = get("resources");
    if (!res) return null;
    const history = (get("history") || {}).memory || [];
    const now = kernelNow();
    const sec = h("div", "nbc-sec");
    sec.appendChild(h("div", "nbc-sec-title", "Memory"));
    const host = res.host || {};
    if (isNum(host.rss)) {
      const row = h("div", "nbc-mem");
      const note = [`${bytes(host.rss)} resident`];
      if (isNum(host.total)) note.push(`of ${bytes(host.total)}`);
      if (isNum(host.available)) note.push(`· ${bytes(host.available)} available`);
      if (isNum(host.children_rss) && host.children_rss > 0) note.push(`· children ${bytes(host.children_rss)}`);
      row.append(h("span", "", "Kernel (host)"), bar(isNum(host.total) && host.total ? host.rss / host.total : null,
        `kernel RSS ${bytes(host.rss)}`), h("span", "nbc-small nbc-muted", note.join(" ")),
      sparkline(history, 1, now, null, "kernel RSS, last minutes"));
      sec.appendChild(row);
    }
    const gpu = res.gpu || {};
    for (const dev of gpu.devices || []) {
      const row = h("div", "nbc-mem");
      const note = [`${bytes(dev.used)} of ${bytes(dev.total)} used`];
      if (isNum(dev.process_used)) note.push(`· this kernel ${bytes(dev.process_used)}`);
      if (isNum(dev.tf_current)) note.push(`· TensorFlow ${bytes(dev.tf_current)}`);
      const label = h("span", "nbc-name", `GPU ${dev.index} ${dev.name || ""}`);
      label.title = String(dev.name || "");
      row.append(label, bar(isNum(dev.total) && dev.total ? dev.used / dev.total : null, `GPU ${dev.index} used`),
        h("span", "nbc-small nbc-muted", note.join(" ")),
        sparkline(history, 2, now, isNum(dev.total) ? dev.total : null, "GPU memory used, last minutes"));
      sec.appendChild(row);
    }
    if (!(gpu.devices || []).length && gpu.reason) sec.appendChild(h("div", "nbc-small nbc-muted", `GPU: ${gpu.reason}`));
    if (gpu.tf_note) sec.appendChild(h("div", "nbc-small nbc-muted", gpu.tf_note));
    if (isNum(res.native_threads)) {
      sec.appendChild(h("div", "nbc-small nbc-muted", `${plural(res.native_threads, "native thread")} in the kernel process`));
    }
    const kids = res.children || [];
    if (kids.length) {
      sec.appendChild(h("div", "nbc-small", `${plural(kids.length, "child process", "child processes")}:`));
      for (const c of kids) {
        const where = isNum(c.cell) ? ` · cell [${c.cell}]` : "";
        const line = h("div", `nbc-small nbc-code nbc-kids nbc-line${c.status === "zombie" ? " nbc-why" : ""}`,
          `${c.pid} ${c.status} ${bytes(c.rss)}${where} · ${c.cmdline}`);
        line.title = String(c.cmdline);
        sec.appendChild(line);
      }
    }
    return sec;
  }

  function drawFailures() {
    const failures = get("failures") || [];
    if (!failures.length) return null;
    const sec = h("div", "nbc-sec");
    sec.appendChild(h("div", "nbc-sec-title", "Thread failures"));
    failures.slice().reverse().forEach((/** @type {any} */ f) => {
      const key = `${f.at}-${f.thread_name}`;
      const line = h("div", "nbc-ghead nbc-small");
      line.dataset.action = "toggle-traceback";
      line.dataset.key = key;
      line.append(h("span", "nbc-caret", ui.tracebacks.has(key) ? "▾" : "▸"),
        h("span", "nbc-code", f.thread_name),
        h("span", "nbc-muted", isNum(f.cell) ? `cell [${f.cell}]` : ""),
        h("span", "nbc-why nbc-line", `${f.exc_type}: ${f.message}`));
      sec.appendChild(line);
      if (ui.tracebacks.has(key)) sec.appendChild(h("div", "nbc-pre", f.traceback));
    });
    return sec;
  }

  function drawLastStop() {
    const last = get("last_stop");
    if (!last) return null;
    const now = kernelNow();
    const sec = h("div", "nbc-sec");
    sec.dataset.section = "last-stop";
    const title = h("div", "nbc-sec-title");
    const scope = last.scope === "cell" ? `cell [${last.cell}]` : last.scope;
    title.append(h("span", "", `Last stop (${scope})`),
      h("span", "nbc-muted nbc-small", isNum(last.started_at) ? `${duration(now - last.started_at)} ago` : ""));
    sec.appendChild(title);
    const alive = last.alive || [];
    const summary = h("div", "nbc-small");
    summary.append(h("span", `nbc-chip ${alive.length ? "err" : "ok"}`,
      `${last.stopped_count} stopped, ${alive.length} still alive`),
    h("span", "nbc-muted", ` in ${Math.round((last.took_s || 0) * 1000)} ms`));
    if (last.route) {
      const via = last.route === "ordinary" ? "the widget message" : `the ${last.route} route`;
      summary.append(h("span", "nbc-muted", ` · via ${via}`));
    }
    if (isNum(last.clicked_at) && isNum(last.received_at)) {
      // Both clocks in kernel time: the click's moment corrected by this view's clock offset.
      const latency = Math.max(0, Math.round(last.received_at * 1000 - (last.clicked_at + ui.offsetMs)));
      const handled = h("span", "nbc-muted", ` · handled ${latency} ms after the click`);
      handled.dataset.latency = String(latency);
      summary.append(handled);
    }
    sec.appendChild(summary);
    for (const a of alive) {
      sec.appendChild(h("div", "nbc-small nbc-kids nbc-why", `${a.name} (${a.tid}): ${a.reason}`));
    }
    for (const e of last.stopper_errors || []) {
      sec.appendChild(h("div", "nbc-small nbc-kids nbc-why", `stopper ${e.stopper} failed: ${e.error}`));
    }
    if (alive.length && !last.force) {
      const force = h("button", "nbc-btn", "force stop");
      force.dataset.action = "force";
      force.title = "Raise ThreadStopped in the threads still running Python code";
      sec.appendChild(force);
    }
    return sec;
  }

  let scheduled = false;
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    queueMicrotask(() => {
      scheduled = false;
      draw();
    });
  }

  function draw() {
    if (ui.pending) {
      const last = get("last_stop");
      if (last && (last.click_ids || [last.click_id]).includes(ui.pending.click_id)) ui.pending = null;
    }
    const scrolls = new Map([...body.querySelectorAll("[data-scroll]")].map((n) => [
      /** @type {HTMLElement} */ (n).dataset.scroll, n.scrollTop,
    ]));
    drawHead();
    drawStatus();
    const sections = [drawThreads(), drawQueues(), drawMemory(), drawFailures(), drawLastStop()];
    body.replaceChildren(.../** @type {HTMLElement[]} */ (sections.filter(Boolean)));
    for (const node of body.querySelectorAll("[data-scroll]")) {
      const top = scrolls.get(/** @type {HTMLElement} */ (node).dataset.scroll);
      if (top) node.scrollTop = top;
    }
  }

  /** Every second: the figures that move on their own, and the unresponsive banner. */
  function tick() {
    const now = kernelNow();
    for (const node of root.querySelectorAll("[data-since]")) {
      const item = /** @type {HTMLElement} */ (node);
      const row = item.closest("[data-tid]");
      const state = row && row.querySelector(".nbc-dot") ? /** @type {HTMLElement} */ (row.querySelector(".nbc-dot")).title : "";
      item.textContent = idleText(now - Number(item.dataset.since), state);
    }
    for (const node of root.querySelectorAll("[data-blocked]")) {
      const item = /** @type {HTMLElement} */ (node);
      const [text, since] = JSON.parse(String(item.dataset.blocked));
      item.textContent = blockedText({ text, since }, now);
    }
    drawStatus();
  }

  // ------------------------------------------------------------------------------------------- events
  /** @param {Event} event */
  function onClick(event) {
    const target = /** @type {HTMLElement | null} */ (event.target instanceof Element ? event.target.closest("[data-action]") : null);
    if (!target || !root.contains(target)) return;
    const action = target.dataset.action;
    if (action === "stop-all") stop({ scope: "all" });
    else if (action === "stop-zombies") stop({ scope: "zombies" });
    else if (action === "stop-cell") stop({ scope: "cell", cell: Number(target.dataset.cell) });
    else if (action === "stop-thread") stop({ scope: "thread", tid: target.dataset.tid });
    else if (action === "force") {
      const last = get("last_stop") || {};
      /** @type {Record<string, unknown>} */
      const scope = { scope: last.scope || "all", force: true };
      if (last.scope === "cell") scope.cell = last.cell;
      if (last.scope === "thread") {
        const alive = last.alive || [];
        if (!alive.length) return;
        scope.tid = alive[0].tid;
      }
      stop(scope);
    } else if (action === "stack") {
      event.stopPropagation();
      const tid = String(target.dataset.tid);
      if (ui.stacks.has(tid)) ui.stacks.delete(tid);
      else {
        ui.stacks.add(tid);
        send({ type: "stack", tid });
      }
      schedule();
    } else if (action === "toggle-group") {
      if (event.target instanceof Element && event.target.closest("button")) return;
      const key = String(target.dataset.group);
      if (ui.closedGroups.has(key)) ui.closedGroups.delete(key);
      else ui.closedGroups.add(key);
      schedule();
    } else if (action === "toggle-traceback") {
      const key = String(target.dataset.key);
      if (ui.tracebacks.has(key)) ui.tracebacks.delete(key);
      else ui.tracebacks.add(key);
      schedule();
    }
  }

  function onChange() {
    ui.lastUpdate = performance.now();
    schedule();
  }

  function onClock() {
    const clock = get("clock");
    if (clock && clock.view_id === viewId && isNum(clock.client_time) && isNum(clock.kernel_time)) {
      // Half the round trip is the best guess of when the kernel read its clock.
      const mid = (clock.client_time + Date.now()) / 2;
      ui.offsetMs = clock.kernel_time * 1000 - mid;
    }
    onChange();
  }

  /** @type {Array<[string, () => void]>} */
  const listeners = TRAITS.map((name) => [`change:${name}`, name === "clock" ? onClock : onChange]);
  for (const [event, callback] of listeners) model.on(event, callback);
  root.addEventListener("click", onClick);
  const ticker = setInterval(tick, TICK_MS);
  const renew = setInterval(() => send({ type: "view", view_id: viewId, action: "alive" }), RENEW_MS);
  send({ type: "view", view_id: viewId, action: "open", client_time: Date.now() });
  draw();
  // The link to the server page only where the server has nbcoord's extension (HEAD /nbcoord/ answers 200).
  const fleet = fleetUrl();
  if (fleet) {
    fetch(fleet, { method: "HEAD", credentials: "same-origin" })
      .then((response) => {
        if (response.ok) {
          ui.fleet = fleet;
          schedule();
        }
      })
      .catch(() => {});
  }

  return () => {
    clearInterval(ticker);
    clearInterval(renew);
    for (const [event, callback] of listeners) model.off(event, callback);
    root.removeEventListener("click", onClick);
    try {
      send({ type: "view", view_id: viewId, action: "close" });
    } catch (err) {
      // the comm may already be closed (the widget was closed in the kernel)
    }
    root.remove();
  };
}

export default { render };
