// @ts-check
/**
 * nbcoord's live panel: the front end of nbcoord.panel.widget.NBCoordPanel (anywidget).
 *
 * State arrives in traits set by the kernel (header, threads, ledger, groups, cells, cell_memory, sessions,
 * queues, blocked, resources, failures, history, last_stop, outcome, stack, clock, beat, ack); this module only
 * draws it and sends commands (stop, restart, reclaim, stack, view), each with a click id. Every string from the
 * kernel is set with textContent, after control and bidirectional characters are shown escaped (`safe`):
 * nothing from the kernel is ever parsed as HTML, and no name can reorder the text around it. Names arrive cut
 * to 200 characters by the kernel (nbcoord.panel.state.NAME_CHARS), longer texts to 500.
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
 * While a cell runs the kernel sends a beat every interval; when beats stop the panel says the same.
 * A view whose kernel is gone (restarted, shut down) says so at once, greys out and disables its buttons.
 */

const SVG_NS = "http://www.w3.org/2000/svg";
/** The kernel forgets a view that has not renewed for 60 s (nbcoord.panel.panel.VIEW_LEASE_S). */
const RENEW_MS = 20000;
const TICK_MS = 1000;
/** A click not acknowledged this long after it was sent was not handled: the banner says why. */
const ACK_MS = 600;
/** Rows drawn per group before "show all". */
const ROWS_PER_GROUP = 50;
const MAX_BLOCKED = 5;
const MAX_ALIVE_SHOWN = 20;
const MAX_RUNNERS_SHOWN = 10;
const HISTORY_WINDOW_S = 600;
const TRAITS = [
  "header", "threads", "ledger", "groups", "cells", "cell_memory", "sessions", "queues", "blocked",
  "resources", "failures", "history", "last_stop", "outcome", "stack", "clock", "beat", "ack", "_fast_route",
];
/** @type {Record<string, string[]>} the sections each trait is drawn in */
const SECTIONS_OF = {
  header: ["head", "status", "threads"],
  threads: ["threads"],
  ledger: ["threads"],
  groups: ["threads"],
  cells: ["threads", "memory"],
  cell_memory: ["memory", "threads"],
  sessions: ["sessions"],
  queues: ["queues"],
  blocked: ["queues"],
  resources: ["head", "memory"],
  history: ["queues", "memory"],
  failures: ["failures"],
  last_stop: ["last", "head", "threads"],
  outcome: ["outcome", "head", "sessions"],
  stack: ["threads"],
  clock: ["head", "status", "threads", "queues", "sessions", "last", "outcome"],
  beat: ["status"],
  ack: ["status"],
  _fast_route: [],
};
const ALL_SECTIONS = ["head", "status", "threads", "sessions", "queues", "memory", "failures", "last", "outcome"];
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
.nbc { --nbc-fg: var(--jp-ui-font-color1, #1f1f1f); --nbc-muted: var(--jp-ui-font-color2, #5c5c5c);
  --nbc-bg: var(--jp-layout-color1, #fff); --nbc-bg2: var(--jp-layout-color2, #eee);
  --nbc-line: var(--jp-border-color2, #e0e0e0); --nbc-err: var(--jp-error-color1, #c62828);
  --nbc-err-bg: var(--jp-error-color1, #c62828); --nbc-on-err: #fff;
  --nbc-ok: var(--jp-success-color0, #1b5e20); --nbc-warn: var(--jp-warn-color1, #f57c00);
  --nbc-accent: var(--jp-brand-color1, #1976d2);
  font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: var(--jp-ui-font-size1, 13px);
  color: var(--nbc-fg); background: var(--nbc-bg); border: 1px solid var(--nbc-line); border-radius: 4px;
  padding: 6px 10px 8px; line-height: 1.4; max-width: 1000px; box-sizing: border-box; }
body[data-jp-theme-light="false"] .nbc { --nbc-err: var(--jp-error-color2, #e57373);
  --nbc-err-bg: var(--jp-error-color2, #e57373); --nbc-on-err: #000; --nbc-ok: var(--jp-success-color2, #81c784); }
.nbc * { box-sizing: border-box; }
.nbc-head { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 12px; }
.nbc-title { font-weight: 600; letter-spacing: .02em; }
.nbc-muted { color: var(--nbc-muted); }
.nbc-small { font-size: var(--jp-ui-font-size0, 11px); }
.nbc-code { font-family: var(--jp-code-font-family, monospace); font-size: var(--jp-code-font-size, 12px); }
.nbc-fig { display: inline-flex; align-items: center; gap: 5px; white-space: nowrap; }
.nbc-fig b { font-weight: 600; }
.nbc-spacer { flex: 1 1 auto; }
.nbc-head-actions { display: inline-flex; align-items: center; gap: 8px; margin-left: auto; }
.nbc-chip { display: inline-block; border-radius: 9px; padding: 0 7px; white-space: nowrap;
  font-size: var(--jp-ui-font-size0, 11px); background: var(--nbc-bg2); color: var(--nbc-fg); }
.nbc-chip.err { background: var(--nbc-err-bg); color: var(--nbc-on-err); }
.nbc-chip.warn { background: transparent; box-shadow: inset 0 0 0 1px var(--nbc-warn); color: var(--nbc-fg); }
.nbc-chip.ok { background: transparent; box-shadow: inset 0 0 0 1px var(--nbc-ok); color: var(--nbc-ok); }
.nbc-btn { font: inherit; font-size: var(--jp-ui-font-size0, 11px); line-height: 1.5; cursor: pointer;
  color: var(--nbc-fg); background: var(--nbc-bg2); border: 1px solid var(--jp-border-color1, #bdbdbd);
  border-radius: 3px; padding: 0 8px; }
.nbc-btn:hover { background: var(--jp-layout-color3, #ddd); }
.nbc-btn.danger { background: var(--nbc-err-bg); border-color: var(--nbc-err-bg); color: var(--nbc-on-err);
  font-weight: 600; font-size: var(--jp-ui-font-size1, 13px); padding: 1px 12px; }
.nbc-btn.danger:hover { filter: brightness(.92); }
.nbc-btn.wide { font-size: var(--jp-ui-font-size1, 13px); padding: 1px 10px; }
.nbc-btn.busy { cursor: progress; }
.nbc-btn:disabled { cursor: not-allowed; background: var(--nbc-bg); border-color: var(--nbc-line);
  color: var(--nbc-muted); font-weight: 400; }
.nbc-row .nbc-btn { background: transparent; border-color: transparent; color: var(--nbc-muted); }
.nbc-row:hover .nbc-btn, .nbc-row .nbc-btn:focus, .nbc-row .nbc-btn.busy { border-color: var(--jp-border-color1, #bdbdbd);
  background: var(--nbc-bg); color: var(--nbc-fg); }
.nbc-status { margin-top: 3px; }
.nbc-banner { margin-top: 4px; padding: 3px 8px; border-left: 3px solid var(--nbc-warn);
  background: var(--nbc-bg2); color: var(--nbc-fg); }
.nbc-sec { margin-top: 7px; padding-top: 5px; border-top: 1px solid var(--nbc-line); }
.nbc-sec-title { font-weight: 600; margin-bottom: 3px; display: flex; gap: 8px; align-items: baseline; flex-wrap: wrap; }
.nbc-filter { font: inherit; font-size: var(--jp-ui-font-size0, 11px); font-weight: 400; margin-left: auto;
  color: var(--nbc-fg); background: var(--nbc-bg); border: 1px solid var(--jp-border-color1, #bdbdbd);
  border-radius: 3px; padding: 0 6px; width: 16em; }
.nbc-filter::placeholder { color: var(--nbc-muted); opacity: 1; }
.nbc-scroll { max-height: 24em; overflow-y: auto; }
.nbc-scroll.short { max-height: 10em; }
.nbc-group { margin: 2px 0 4px; }
.nbc-ghead { display: flex; align-items: center; gap: 8px; cursor: pointer; padding: 1px 2px; border-radius: 3px; }
.nbc-caret { width: 1em; display: inline-block; color: var(--nbc-muted); }
.nbc-line { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; max-width: 32em; }
.nbc-row { display: grid; grid-template-columns: 10px minmax(10em, 18em) 3em minmax(8em, 1fr) 7em 4.5em auto;
  align-items: center; gap: 8px; padding: 1px 2px 1px 18px; border-left: 3px solid transparent; }
.nbc-row.zombie { border-left-color: var(--nbc-err-bg); }
.nbc-name { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nbc-dot { width: 9px; height: 9px; border-radius: 50%; background: var(--jp-ui-font-color3, #bdbdbd); }
.nbc-dot.running { background: var(--jp-success-color1, #388e3c); }
.nbc-dot.waiting { background: var(--nbc-accent); }
.nbc-dot.stopping { background: var(--nbc-warn); }
.nbc-dot.zombie { background: var(--nbc-err-bg); }
.nbc-info { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nbc-actions { display: flex; gap: 4px; justify-content: flex-end; }
.nbc-why { color: var(--nbc-err); }
.nbc-more { margin: 1px 0 3px 18px; display: flex; gap: 8px; align-items: baseline; }
.nbc-link { font: inherit; background: none; border: none; padding: 0; cursor: pointer; color: var(--nbc-fg);
  text-decoration: underline; }
.nbc-pre { margin: 2px 0 4px 30px; padding: 4px 6px; max-height: 16em; overflow: auto; white-space: pre;
  background: var(--nbc-bg2); color: var(--nbc-fg); border-radius: 3px; font-family: var(--jp-code-font-family, monospace);
  font-size: var(--jp-code-font-size, 12px); }
.nbc-q { display: grid; grid-template-columns: minmax(8em, 14em) 120px 7em minmax(8em, 1fr) 120px 9em; gap: 10px;
  align-items: center; padding: 1px 2px; }
.nbc-mem { display: grid; grid-template-columns: minmax(7em, 10em) 120px minmax(8em, 1fr) 120px minmax(12em, auto); gap: 10px;
  align-items: center; padding: 1px 2px; }
.nbc-range { font-variant-numeric: tabular-nums; white-space: nowrap; }
.nbc-cellmem { display: flex; gap: 8px; align-items: baseline; padding: 1px 2px; }
.nbc-bar-bg { fill: var(--jp-layout-color3, #e0e0e0); }
.nbc-bar { fill: var(--nbc-accent); }
.nbc-bar.warn { fill: var(--nbc-warn); }
.nbc-bar.err { fill: var(--nbc-err-bg); }
.nbc-spark { fill: none; stroke: var(--nbc-accent); stroke-width: 1.3; }
.nbc-spark-area { fill: var(--jp-brand-color3, #bbdefb); opacity: .6; stroke: none; }
.nbc-spark-base { stroke: var(--nbc-line); stroke-width: 1; }
.nbc-sentence { padding: 1px 2px; }
.nbc-sentence::before { content: "\\26A0\\FE0E  "; }
.nbc-kids { margin-left: 18px; }
.nbc-sess { margin: 2px 0 4px; }
.nbc.stale .nbc-body, .nbc.stale .nbc-head, .nbc.stale .nbc-status { color: var(--nbc-muted); }
.nbc.stale .nbc-body *, .nbc.stale .nbc-head * { color: var(--nbc-muted); }
.nbc.stale .nbc-chip { background: transparent; box-shadow: inset 0 0 0 1px var(--nbc-line); }
.nbc.stale .nbc-dot, .nbc.stale .nbc-bar, .nbc.stale .nbc-spark-area { filter: grayscale(1); }
.nbc.stale .nbc-spark { stroke: var(--nbc-muted); }
`;

// ----------------------------------------------------------------------------------------------- text
/** Control, format and bidirectional characters: never rendered as themselves. */
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]/g;
const UNSAFE_KEEP_LINES = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]/g;
/** @type {Record<string, string>} */
const SHORT_ESCAPES = { "\n": "\\n", "\t": "\\t", "\r": "\\r" };

/**
 * A string from the kernel, with every control, format or bidirectional character shown as an escape
 * (``\u202e``), so that a name cannot hide, reorder or break the text around it.
 * @param {unknown} value
 * @param {boolean} [lines] keep newlines and tabs (tracebacks, stacks)
 * @returns {string}
 */
export function safe(value, lines = false) {
  const text = value === null || value === undefined ? "" : String(value);
  return text.replace(lines ? UNSAFE_KEEP_LINES : UNSAFE,
    (ch) => SHORT_ESCAPES[ch] || `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/**
 * A DOM element; ``text`` is set as text (escaped by `safe`), never parsed.
 * @param {string} tag
 * @param {string} [cls]
 * @param {unknown} [text]
 * @returns {HTMLElement}
 */
function h(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = safe(text);
  return node;
}

/**
 * Set text only when it differs (a node whose text did not change is not touched).
 * @param {Element} node
 * @param {unknown} text
 */
function setText(node, text) {
  const value = safe(text);
  if (node.textContent !== value) node.textContent = value;
}

/** @param {Element} node @param {string} cls */
function setClass(node, cls) {
  if (node.getAttribute("class") !== cls) node.setAttribute("class", cls);
}

/** @param {HTMLElement} node @param {unknown} title */
function setTitle(node, title) {
  const value = safe(title, true);
  if (node.title !== value) node.title = value;
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

/** @param {unknown} n @returns {n is number} */
function isNum(n) {
  return typeof n === "number" && Number.isFinite(n);
}

/** @param {unknown} n */
function bytes(n) {
  if (!isNum(n)) return "n/a";
  let v = n;
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

/** A wall-clock time of day, from kernel seconds. @param {number} at */
function clockTime(at) {
  const d = new Date(at * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, "0")).join(":");
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

/**
 * A sentence whose growing duration the kernel left as "{duration}", drawn here from ``since``.
 * @param {{text: string, since?: number}} b @param {number} now
 */
function sinceText(b, now) {
  return isNum(b.since) ? b.text.replace("{duration}", `${Math.max(0, now - b.since).toFixed(1)} s`) : b.text;
}

/** Zombie reasons in words, first cause first. @param {any} row */
function reasonsText(row) {
  /** @type {Array<[string, number]>} */
  const reasons = Array.isArray(row.reasons) && row.reasons.length ? row.reasons : row.zombie ? [[row.zombie, NaN]] : [];
  return reasons.map(([r]) => ZOMBIE_SHORT[/** @type {keyof ZOMBIE_SHORT} */ (r)] || r).join(", then ");
}

/**
 * A zombie in words, naming its cell: "cell [3] was interrupted, then ignored a stop".
 * @param {any} row
 */
function zombieText(row) {
  /** @type {Array<[string, number]>} */
  const reasons = Array.isArray(row.reasons) && row.reasons.length ? row.reasons : row.zombie ? [[row.zombie, NaN]] : [];
  const cell = isNum(row.cell) ? `cell [${row.cell}]` : "no cell";
  /** @type {Record<string, string>} */
  const words = {
    "cell-interrupted": `${cell} was interrupted`,
    "cell-error": `${cell} failed`,
    "stop-ignored": "ignored a stop",
    "owner-closed": "its owner closed",
  };
  const said = reasons.map(([r]) => words[r] || r);
  if (!reasons.some(([r]) => r === "cell-interrupted" || r === "cell-error")) said.unshift(`from ${cell}`);
  return said.join(", then ");
}

/** @param {any} row */
function reasonsTitle(row) {
  /** @type {Array<[string, number]>} */
  const reasons = Array.isArray(row.reasons) && row.reasons.length ? row.reasons : row.zombie ? [[row.zombie, NaN]] : [];
  return reasons.map(([r, since]) => `${ZOMBIE_WORDS[/** @type {keyof ZOMBIE_WORDS} */ (r)] || r}${isNum(since) ? ` (since ${clockTime(since)})` : ""}`)
    .join("\n");
}

// ---------------------------------------------------------------------------------------- svg pictures
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
  svg.setAttribute("aria-label", safe(label));
  const title = s("title", {});
  title.textContent = safe(label);
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
 * The usable ``[t, value]`` points of column ``col``, in the window ending at ``now``.
 * @param {Array<Array<number | null>>} points @param {number} col @param {number} now
 * @returns {Array<[number, number]>}
 */
function series(points, col, now) {
  const start = now - HISTORY_WINDOW_S;
  /** @type {Array<[number, number]>} */
  const out = [];
  for (const p of points || []) {
    if (!Array.isArray(p) || !isNum(p[0]) || !isNum(p[col])) continue;
    out.push([/** @type {number} */ (p[0]), /** @type {number} */ (p[col])]);
  }
  // The level at the window's start is the last point before it.
  const before = out.filter(([t]) => t < start);
  const inside = out.filter(([t]) => t >= start);
  return before.length ? [before[before.length - 1], ...inside] : inside;
}

/**
 * A step sparkline of change points over the last window ending at ``now``.
 * @param {Array<[number, number]>} usable
 * @param {number} now kernel time, seconds
 * @param {number | null} top the value drawn at full height (null: the series' maximum)
 * @param {string} label
 */
function sparkline(usable, now, top, label, width = 120, height = 22) {
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "nbc-sparksvg" });
  svg.setAttribute("aria-label", safe(label));
  const title = s("title", {});
  title.textContent = safe(label);
  svg.appendChild(title);
  svg.appendChild(s("line", { class: "nbc-spark-base", x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5 }));
  if (!usable.length) return svg;
  const first = Math.max(now - HISTORY_WINDOW_S, Math.min(usable[0][0], now));
  const span = Math.max(1, now - first);
  const max = top && top > 0 ? top : Math.max(1, ...usable.map((p) => p[1]));
  const x = (/** @type {number} */ t) => ((Math.max(t, first) - first) / span) * (width - 1);
  const y = (/** @type {number} */ v) => height - 1 - (Math.min(v, max) / max) * (height - 3);
  let d = "";
  usable.forEach((p, i) => {
    const px = x(p[0]).toFixed(1);
    const py = y(p[1]).toFixed(1);
    d += i === 0 ? `M${px} ${py}` : `H${px}V${py}`;
  });
  d += `H${(width - 1).toFixed(1)}`;
  svg.appendChild(s("path", { class: "nbc-spark-area", d: `${d}V${height - 1}H${x(first).toFixed(1)}Z` }));
  svg.appendChild(s("path", { class: "nbc-spark", d }));
  return svg;
}

/**
 * "now 7 · 2-9": the current value and the range a sparkline covers.
 * @param {Array<[number, number]>} usable @param {(v: number) => string} format @param {number | null} current
 */
function rangeText(usable, format, current) {
  const values = usable.map((p) => p[1]);
  if (current !== null && isNum(current)) values.push(current);
  if (!values.length) return "";
  const now = current !== null && isNum(current) ? current : values[values.length - 1];
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  return `now ${format(now)} · range ${format(lo)}–${format(hi)}`;
}

// -------------------------------------------------------------------------------------- keyed lists
/**
 * @typedef {HTMLElement & {_sig?: string}} Keyed
 */

/**
 * Make ``parent``'s children the nodes of ``items``, in order, reusing each node by its key; a node whose
 * signature did not change is not touched (``update`` is not called for it).
 * @template T
 * @param {HTMLElement} parent
 * @param {Map<string, Keyed>} cache
 * @param {T[]} items
 * @param {(item: T) => string} keyOf
 * @param {(item: T) => string} sigOf
 * @param {(item: T) => Keyed} create
 * @param {(node: Keyed, item: T) => void} update
 */
function reconcile(parent, cache, items, keyOf, sigOf, create, update) {
  /** @type {Keyed[]} */
  const nodes = [];
  const keep = new Set();
  for (const item of items) {
    const key = keyOf(item);
    if (keep.has(key)) continue;
    keep.add(key);
    let node = cache.get(key);
    if (!node) {
      node = create(item);
      cache.set(key, node);
    }
    const sig = sigOf(item);
    if (node._sig !== sig) {
      update(node, item);
      node._sig = sig;
    }
    nodes.push(node);
  }
  for (const [key, node] of cache) {
    if (!keep.has(key)) {
      node.remove();
      cache.delete(key);
    }
  }
  let cursor = parent.firstChild;
  for (const node of nodes) {
    if (node === cursor) cursor = cursor.nextSibling;
    else parent.insertBefore(node, cursor);
  }
}

// ---------------------------------------------------------------------------------------- commands
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

/** The kernel connection of the page (JupyterLab, Notebook 7), if the widget manager exposes it. @param {any} model */
function kernelOf(model) {
  try {
    const kernel = model.widget_manager && model.widget_manager.kernel;
    return kernel && typeof kernel === "object" ? kernel : null;
  } catch (err) {
    return null;
  }
}

/** @param {Map<string, any[]>} map @param {string} key @param {any} value */
function push(map, key, value) {
  const list = map.get(key);
  if (list) list.push(value);
  else map.set(key, [value]);
}

/** The larger of a cell's GPU and RAM growth, in bytes. @param {any} m */
function memoryGrowth(m) {
  const gpu = isNum(m.gpu_after) && isNum(m.gpu_before) ? Math.abs(m.gpu_after - m.gpu_before) : 0;
  const rss = isNum(m.rss_after) && isNum(m.rss_before) ? Math.abs(m.rss_after - m.rss_before) : 0;
  return Math.max(gpu, rss);
}

/**
 * "cell [7]: +2.1 GiB on the GPU, still held".
 * @param {any} m @param {boolean} [short]
 */
function memoryText(m, short = false) {
  const parts = [];
  const gpu = isNum(m.gpu_after) && isNum(m.gpu_before) ? m.gpu_after - m.gpu_before : null;
  const rss = isNum(m.rss_after) && isNum(m.rss_before) ? m.rss_after - m.rss_before : null;
  const mib = 1 << 20;
  if (gpu !== null && Math.abs(gpu) >= mib) parts.push(`${gpu > 0 ? "+" : "−"}${bytes(Math.abs(gpu))} on the GPU`);
  if (rss !== null && Math.abs(rss) >= mib) parts.push(`${rss > 0 ? "+" : "−"}${bytes(Math.abs(rss))} RAM`);
  if (!parts.length) return "";
  const grew = (gpu !== null && gpu >= mib) || (rss !== null && rss >= mib);
  const text = `${parts.join(", ")}${grew ? (m.held ? ", still held" : ", since freed") : ""}`;
  return short ? (m.held && grew ? text : "") : text;
}

/**
 * What a section sees of its view: the model, the per-view UI state and the view's actions.
 * @typedef {{
 *   model: any, ui: any, get: (name: string) => any, kernelNow: () => number, frozenNow: () => number,
 *   send: (command: Record<string, unknown>) => string | null, mark: (...sections: string[]) => void,
 *   button: (node: HTMLButtonElement, key: string, idle: string, busy: string) => void,
 * }} View
 */

/**
 * A part of the panel: its elements, the function that brings them up to date, and what undoes its listeners.
 * @typedef {{ els: HTMLElement[], draw: () => void, dispose?: () => void }} Section
 */

// ------------------------------------------------------------------------------------------ sections
/**
 * The header: the kernel, its counts and memory, the link to the server page, the actions.
 * @param {View} v
 * @returns {Section}
 */
function headSection(v) {
  const { ui, get, button } = v;
  const head = h("div", "nbc-head");
  const headParts = {
    title: h("span", "nbc-title", "nbcoord"),
    pid: h("span", "nbc-muted"),
    threads: h("span", "nbc-fig"),
    zombies: h("span", "nbc-chip"),
    queues: h("span", "nbc-fig"),
    ram: h("span", "nbc-fig"),
    gpus: h("span", "nbc-fig"),
    spacer: h("span", "nbc-spacer"),
    link: /** @type {HTMLAnchorElement} */ (h("a", "nbc-small", "All kernels ↗")),
    reclaim: /** @type {HTMLButtonElement} */ (h("button", "nbc-btn wide", "Reclaim memory")),
    background: /** @type {HTMLButtonElement} */ (h("button", "nbc-btn wide", "Stop background work")),
    all: /** @type {HTMLButtonElement} */ (h("button", "nbc-btn danger", "Stop all")),
  };
  const headActions = h("span", "nbc-head-actions");
  headParts.link.target = "_blank";
  headParts.link.rel = "noopener";
  headParts.link.title = "Every kernel of this Jupyter server: zombies, GPU memory, stuck kernels (nbcoord's server page)";
  headParts.reclaim.dataset.action = "reclaim";
  headParts.reclaim.title = "Free memory the kernel no longer needs (garbage, caches); cell outputs are left alone";
  headParts.background.dataset.action = "stop-background";
  headParts.background.title = "Stop every thread, task and pool the cells started; the running cell goes on";
  headParts.all.dataset.action = "stop-all";
  headParts.all.title = "Stop everything: every thread, task and pool the cells started, and the running cell "
    + "(as Interrupt does). Works while a cell is busy.";
  headActions.append(headParts.link, headParts.reclaim, headParts.background, headParts.all);
  head.append(headParts.title, headParts.pid, headParts.threads, headParts.zombies, headParts.queues, headParts.ram,
    headParts.gpus, headParts.spacer, headActions);

  function drawHead() {
    const header = get("header") || {};
    const res = get("resources");
    setText(headParts.pid, isNum(header.pid) ? `kernel ${header.pid}` : "");
    setText(headParts.threads, isNum(header.threads) ? plural(header.threads, "thread") : "");
    headParts.zombies.hidden = !isNum(header.zombies);
    setText(headParts.zombies, isNum(header.zombies) ? plural(header.zombies, "zombie") : "");
    setClass(headParts.zombies, `nbc-chip ${header.zombies ? "err" : "ok"}`);
    headParts.queues.hidden = !(isNum(header.queues) && header.queues);
    setText(headParts.queues, isNum(header.queues) ? plural(header.queues, "queue") : "");
    const ramSig = JSON.stringify(res && res.host);
    if (/** @type {Keyed} */ (headParts.ram)._sig !== ramSig && res && res.host && isNum(res.host.rss)) {
      /** @type {Keyed} */ (headParts.ram)._sig = ramSig;
      headParts.ram.replaceChildren();
      const host = res.host;
      headParts.ram.append(h("span", "nbc-muted", "RAM"), h("b", "", bytes(host.rss)));
      if (isNum(host.total) && host.total > 0) {
        headParts.ram.append(bar(host.rss / host.total, `kernel RSS ${bytes(host.rss)} of ${bytes(host.total)}`, 60, 8));
      }
    }
    const devices = (res && res.gpu && res.gpu.devices) || [];
    const gpuSig = JSON.stringify(devices);
    if (/** @type {Keyed} */ (headParts.gpus)._sig !== gpuSig) headParts.gpus.replaceChildren();
    for (const dev of /** @type {Keyed} */ (headParts.gpus)._sig !== gpuSig ? devices : []) {
      headParts.gpus.append(h("span", "nbc-muted", `GPU${devices.length > 1 ? ` ${dev.index}` : ""}`),
        h("b", "", `${bytes(dev.used)} / ${bytes(dev.total)}`));
      if (isNum(dev.used) && isNum(dev.total) && dev.total > 0) {
        headParts.gpus.append(bar(dev.used / dev.total, `GPU ${dev.index} ${bytes(dev.used)} of ${bytes(dev.total)}`, 60, 8));
      }
    }
    /** @type {Keyed} */ (headParts.gpus)._sig = gpuSig;
    headParts.link.hidden = !ui.fleet;
    if (ui.fleet && headParts.link.href !== ui.fleet) headParts.link.href = ui.fleet;
    headParts.reclaim.hidden = !header.reclaim;
    button(headParts.reclaim, "reclaim", "Reclaim memory", "Reclaiming…");
    button(headParts.background, "background", "Stop background work", "Stopping…");
    button(headParts.all, "all", "Stop all", "Stopping…");
  }
  return { els: [head], draw: drawHead };
}

/**
 * The status line and the banner (busy in a C call, beats that stopped, a kernel gone).
 * @param {View} v
 * @returns {Section}
 */
function statusSection(v) {
  const { ui, get, model, kernelNow } = v;
  const status = h("div", "nbc-status nbc-small nbc-muted");
  const banner = h("div", "nbc-banner");
  banner.setAttribute("role", "status");
  banner.hidden = true;
  function drawStatus() {
    const header = get("header") || {};
    const now = kernelNow();
    const parts = [];
    const kernel = kernelOf(model);
    const pageBusy = kernel && kernel.status === "busy";
    if (ui.stale) {
      parts.push(`kernel gone at ${clockTime(ui.stale.at)}`);
    } else if (isNum(header.running_cell)) {
      const since = isNum(header.running_since) ? ` for ${duration(now - header.running_since)}` : "";
      parts.push(`cell [${header.running_cell}] running${since}`);
    } else if (pageBusy) {
      parts.push(`kernel busy${ui.busySince ? ` since ${clockTime(ui.busySince)}` : ""}`);
    } else if (header.pid !== undefined) {
      parts.push("kernel idle");
    }
    if (isNum(header.kernel_threads)) parts.push(`${plural(header.kernel_threads, "kernel thread")} not shown`);
    if (isNum(header.native_threads)) parts.push(plural(header.native_threads, "native thread"));
    if (header.route === "none") parts.push("no fast route: Stop acts when the running cell ends");
    setText(status, parts.join(" · "));
    drawBanner(header, now, pageBusy);
  }

  /** @param {any} header @param {number} now @param {boolean} pageBusy */
  function drawBanner(header, now, pageBusy) {
    let text = "";
    if (ui.stale) {
      text = `The kernel of this panel is gone (${ui.stale.why}). What it shows is from ${clockTime(ui.stale.at)}; `
        + "its buttons are off. Run %nbcoord panel in the new kernel for a live panel.";
    } else {
      const beat = get("beat");
      const every = beat && isNum(beat.every) ? beat.every : isNum(header.interval) ? header.interval : 1;
      const limit = 3 * every * 1000 + 1000;
      const silent = performance.now() - ui.lastUpdate;
      const unanswered = [...ui.pending.values()].filter((p) => !p.acked && performance.now() - p.at > ACK_MS);
      const running = isNum(header.running_cell) || pageBusy;
      if (unanswered.length && header.route !== "none") {
        const beatAt = beat && isNum(beat.at) ? beat.at : 0;
        const since = Math.max(ui.lastHeard, beatAt, ui.busySince || 0, isNum(header.running_since) ? header.running_since : 0);
        text = `Kernel busy in a C call since ${clockTime(since)} (${duration(now - since)}): it holds the GIL, so `
          + "your click waits; the stop will act when the call returns.";
      } else if (silent > limit && isNum(header.running_cell)) {
        text = `Kernel busy in native code (no update for ${duration(silent / 1000)}); stop will act when it returns.`;
      } else if (unanswered.length && header.route === "none" && running) {
        const cell = isNum(header.running_cell) ? `cell [${header.running_cell}]` : "the running cell";
        text = `Stop will act when ${cell} ends (no fast route for this kernel).`;
      }
    }
    if (banner.hidden !== !text) banner.hidden = !text;
    setText(banner, text);
  }
  return { els: [status, banner], draw: drawStatus };
}

/**
 * Threads and tasks, grouped by the cell that started them, zombies first; a filter box.
 * @param {View} v
 * @returns {Section}
 */
function threadsSection(v) {
  const { ui, get, frozenNow, button, send } = v;
  const threadSec = h("div", "nbc-sec");
  threadSec.dataset.section = "threads";
  const threadTitle = h("div", "nbc-sec-title");
  const threadLabel = h("span", "", "Threads");
  const threadNote = h("span", "nbc-muted nbc-small");
  const filterBox = /** @type {HTMLInputElement} */ (h("input", "nbc-filter"));
  filterBox.type = "search";
  filterBox.placeholder = "filter: name, cell, state";
  filterBox.setAttribute("aria-label", "Filter threads by name, cell or state");
  threadTitle.append(threadLabel, threadNote, filterBox);
  const threadEmpty = h("div", "nbc-muted nbc-small");
  const threadScroll = h("div", "nbc-scroll");
  threadSec.append(threadTitle, threadEmpty, threadScroll);
  /** @type {Map<string, Keyed>} */
  const groupNodes = new Map();

  /** @param {any} row @param {Map<number, any>} cells */
  function matches(row, cells) {
    if (!ui.filter) return true;
    const cell = isNum(row.cell) ? cells.get(row.cell) : null;
    const hay = [row.name, row.label, row.tid, row.id, row.kind, row.state, row.detail, reasonsText(row),
      row.zombie ? "zombie" : "", isNum(row.cell) ? `cell [${row.cell}] ${row.cell}` : "", cell ? cell.line : "",
      ...(row.owners || []).map((/** @type {any} */ o) => o.label)].join("\u0001").toLowerCase();
    return ui.filter.split(/\s+/).every((word) => hay.includes(word));
  }

  function drawThreads() {
    const threads = get("threads") || [];
    const ledger = get("ledger") || [];
    const header = get("header") || {};
    const cells = new Map((get("cells") || []).map((/** @type {any} */ c) => [c.n, c]));
    const memory = new Map((get("cell_memory") || []).map((/** @type {any} */ m) => [m.cell, m]));
    /** @type {any[]} */
    let groups = get("groups") || [];
    if (!groups.length && (threads.length || ledger.length)) groups = localGroups(threads, ledger);
    setText(threadLabel, ledger.length || header.items ? "Threads and tasks" : "Threads");
    const sent = threads.length;
    const total = isNum(header.threads) ? header.threads : sent;
    setText(threadNote, total > sent ? `the kernel lists the first ${sent} of ${total}; Stop all and stop cell reach all` : "");
    /** @type {Map<string, any[]>} */
    const rowsOf = new Map();
    for (const row of threads) push(rowsOf, groupKey(row), { ...row, _kind: "thread" });
    for (const row of ledger) push(rowsOf, groupKey(row), { ...row, _kind: "item" });
    const empty = !threads.length && !ledger.length && !groups.length;
    threadEmpty.hidden = !empty;
    if (empty) setText(threadEmpty, emptyText());
    const shown = groups.map((/** @type {any} */ g) => ({
      group: g,
      rows: (rowsOf.get(g.key) || []).filter((r) => matches(r, cells)),
      all: rowsOf.get(g.key) || [],
    })).filter((x) => !ui.filter || x.rows.length);
    reconcile(threadScroll, groupNodes, shown, (x) => x.group.key, () => "", createGroup,
      () => {});
    for (const x of shown) updateGroup(/** @type {Keyed} */ (groupNodes.get(x.group.key)), x, cells, memory);
    if (ui.filter && !shown.length && !empty) {
      threadEmpty.hidden = false;
      setText(threadEmpty, `No thread or task matches "${ui.filter}".`);
    }
  }

  function emptyText() {
    const last = get("last_stop");
    if (last && isNum(last.stopped_count) && last.stopped_count > 0 && isNum(last.started_at)) {
      return `No thread started by a cell is running: the stop at ${clockTime(last.started_at)} stopped `
        + `${plural(last.stopped_count, "thread")}.`;
    }
    return "No thread started by a cell is running.";
  }


  /** @param {any} row */
  function groupKey(row) {
    if (row.zombie) return "zombies";
    return isNum(row.cell) ? `c${row.cell}` : "none";
  }

  /** Groups counted here, for a kernel that does not send them. @param {any[]} threads @param {any[]} ledger */
  function localGroups(threads, ledger) {
    /** @type {Map<string, any>} */
    const groups = new Map();
    for (const [kind, rows] of /** @type {Array<[string, any[]]>} */ ([["threads", threads], ["items", ledger]])) {
      for (const row of rows) {
        const key = groupKey(row);
        if (!groups.has(key)) groups.set(key, { key, cell: key.startsWith("c") ? row.cell : null, threads: 0, items: 0 });
        groups.get(key)[kind] += 1;
      }
    }
    const rank = (/** @type {any} */ g) => (g.key === "zombies" ? -1 : g.key === "none" ? 1e12 : g.cell);
    return [...groups.values()].sort((a, b) => rank(a) - rank(b));
  }

  /** @param {{group: any}} x @returns {Keyed} */
  function createGroup(x) {
    const box = /** @type {Keyed} */ (h("div", "nbc-group"));
    box.dataset.group = x.group.key;
    const ghead = h("div", "nbc-ghead");
    ghead.dataset.action = "toggle-group";
    ghead.dataset.group = x.group.key;
    const caret = h("span", "nbc-caret");
    const label = h("span", "");
    const outcome = h("span", "nbc-chip");
    const line = h("span", "nbc-code nbc-muted nbc-line");
    const count = h("span", "nbc-muted nbc-small");
    const mem = h("span", "nbc-small nbc-why");
    const stop = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn"));
    ghead.append(caret, label, outcome, line, count, mem, h("span", "nbc-spacer"), stop);
    const rows = h("div", "nbc-rows");
    const more = h("div", "nbc-more nbc-small nbc-muted");
    box.append(ghead, rows, more);
    /** @type {any} */ (box)._parts = { caret, label, outcome, line, count, mem, stop, rows, more, cache: new Map() };
    return box;
  }

  /**
   * @param {Keyed} box @param {{group: any, rows: any[], all: any[]}} x
   * @param {Map<number, any>} cells @param {Map<number, any>} memory
   */
  function updateGroup(box, x, cells, memory) {
    const p = /** @type {any} */ (box)._parts;
    const g = x.group;
    const closed = ui.closedGroups.has(g.key);
    setText(p.caret, closed ? "▸" : "▾");
    const totalThreads = isNum(g.threads) ? g.threads : x.all.filter((r) => r._kind === "thread").length;
    const totalItems = isNum(g.items) ? g.items : x.all.filter((r) => r._kind === "item").length;
    const total = totalThreads + totalItems;
    const counts = [totalThreads ? plural(totalThreads, "thread") : "", totalItems ? plural(totalItems, "task") : ""]
      .filter(Boolean).join(", ");
    const cell = isNum(g.cell) ? cells.get(g.cell) : null;
    if (g.key === "zombies") {
      setText(p.label, "Zombies");
      setClass(p.label, "nbc-chip err");
    } else if (g.key === "none") {
      setText(p.label, "Not started by a cell");
      setClass(p.label, "");
    } else {
      setText(p.label, `Cell [${g.cell}]`);
      setClass(p.label, "nbc-cellno");
    }
    p.outcome.hidden = !cell;
    if (cell) {
      setText(p.outcome, cell.outcome);
      setClass(p.outcome, `nbc-chip ${cell.outcome === "error" || cell.outcome === "interrupted" ? "err" : cell.outcome === "running" ? "warn" : ""}`);
    }
    setText(p.line, cell ? cell.line : "");
    setTitle(p.line, cell ? cell.line : "");
    setText(p.count, ui.filter ? `${x.rows.length} of ${counts} match` : counts);
    const held = isNum(g.cell) ? memory.get(g.cell) : null;
    setText(p.mem, held ? memoryText(held, true) : "");
    // Stops: a cell's, the zombies'; "not started by a cell" has none.
    p.stop.hidden = g.key === "none";
    if (g.key === "zombies") {
      p.stop.dataset.action = "stop-zombies";
      p.stop.title = "Stop every zombie thread and task";
      button(p.stop, "zombies", "stop zombies", "stopping…");
    } else if (g.key !== "none") {
      p.stop.dataset.action = "stop-cell";
      p.stop.dataset.cell = String(g.cell);
      p.stop.title = `Stop the threads and tasks cell [${g.cell}] started`;
      button(p.stop, `cell:${g.cell}`, "stop cell", "stopping…");
    }
    p.rows.hidden = closed;
    p.more.hidden = closed;
    if (closed) return;
    const limit = ui.expanded.has(g.key) ? Infinity : ROWS_PER_GROUP;
    const drawn = x.rows.slice(0, limit);
    const now = frozenNow();
    const stack = get("stack");
    reconcile(p.rows, p.cache, drawn, rowKey, (row) => rowSig(row, stack), createRow, (node, row) => updateRow(node, row, cells, now));
    // What is cut is said once, here, with the true number, and can be expanded.
    const available = x.rows.length;
    const whole = ui.filter ? available : total;
    const moreSig = `${drawn.length}|${available}|${whole}|${ui.expanded.has(g.key)}|${ui.filter}`;
    if (p.moreSig === moreSig) return;
    p.moreSig = moreSig;
    p.more.replaceChildren();
    if (drawn.length < whole) {
      p.more.append(h("span", "", `Showing ${drawn.length} of ${whole}${ui.filter ? " matches" : ""}.`));
      if (drawn.length < available) {
        const all = h("button", "nbc-link", `Show all ${available}`);
        all.dataset.action = "expand-group";
        all.dataset.group = g.key;
        p.more.append(all);
      }
      if (available < whole) p.more.append(h("span", "", `${whole - available} not listed by the kernel; filter to find one.`));
    } else if (ui.expanded.has(g.key) && drawn.length > ROWS_PER_GROUP) {
      const fewer = h("button", "nbc-link", `Show the first ${ROWS_PER_GROUP}`);
      fewer.dataset.action = "collapse-group";
      fewer.dataset.group = g.key;
      p.more.append(fewer);
    }
  }

  /** @param {any} row */
  function rowKey(row) {
    return row._kind === "item" ? `i:${row.id}` : `t:${row.tid}`;
  }

  /** @param {any} row @param {any} stack */
  function rowSig(row, stack) {
    const open = row._kind === "thread" && ui.stacks.has(row.tid);
    const pend = row._kind === "thread" && ui.pending.has(`thread:${row.tid}`);
    return `${JSON.stringify(row)}|${open ? (stack && stack.tid === row.tid ? stack.click_id || stack.at : "?") : ""}|${pend}|${ui.stale ? 1 : 0}`;
  }

  /** @returns {Keyed} */
  function createRow() {
    const unit = /** @type {Keyed} */ (h("div", "nbc-unit"));
    const line = h("div", "nbc-row");
    const dot = h("span", "nbc-dot");
    const name = h("span", "nbc-name nbc-code");
    const id = h("span", "nbc-muted nbc-small");
    const info = h("span", "nbc-info nbc-small");
    const idle = h("span", "nbc-small nbc-muted");
    const cpu = h("span", "nbc-small nbc-muted");
    const actions = h("span", "nbc-actions");
    const stackBtn = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn", "stack"));
    stackBtn.dataset.action = "stack";
    const stopBtn = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn", "stop"));
    stopBtn.dataset.action = "stop-thread";
    actions.append(stackBtn, stopBtn);
    line.append(dot, name, id, info, idle, cpu, actions);
    const pre = h("div", "nbc-pre");
    pre.hidden = true;
    unit.append(line, pre);
    /** @type {any} */ (unit)._parts = { line, dot, name, id, info, idle, cpu, stackBtn, stopBtn, pre };
    return unit;
  }

  /** @param {Keyed} unit @param {any} row @param {Map<number, any>} cells @param {number} now */
  function updateRow(unit, row, cells, now) {
    const p = /** @type {any} */ (unit)._parts;
    const item = row._kind === "item";
    const zombie = Boolean(row.zombie);
    setClass(p.line, `nbc-row${zombie ? " zombie" : ""}`);
    if (item) p.line.dataset.item = String(row.id);
    else p.line.dataset.tid = String(row.tid);
    setClass(p.dot, `nbc-dot ${zombie ? "zombie" : row.state}`);
    setTitle(p.dot, row.state);
    setText(p.name, item ? row.label : row.name);
    setTitle(p.name, item ? `${row.kind}: ${row.label}` : row.name);
    setText(p.id, item ? row.kind : row.tid);
    // The info column: a zombie names its cell and its reasons; others their owners and errors.
    const parts = [];
    if (zombie) {
      const cell = isNum(row.cell) ? cells.get(row.cell) : null;
      parts.push(zombieText(row));
      if (cell) parts.push(cell.line);
    }
    if (item && row.detail) parts.push(row.detail);
    if (!item && row.owners && row.owners.length) {
      parts.push(row.owners.map((/** @type {any} */ o) => `${o.label}${o.closed ? " (closed)" : ""}`).join(", "));
    }
    if (!item && !row.daemon) parts.push("non-daemon");
    if (!item && row.last_exception) parts.push(`last error: ${row.last_exception}`);
    setText(p.info, parts.join(" · "));
    setClass(p.info, `nbc-info nbc-small ${zombie ? "nbc-why" : "nbc-muted"}`);
    setTitle(p.info, [zombie ? reasonsTitle(row) : "", ...parts.slice(zombie ? 1 : 0)].filter(Boolean).join("\n"));
    // last_active is null while the thread is active; else its idle period's start, in kernel time.
    if (!item && isNum(row.last_active)) {
      p.idle.dataset.since = String(row.last_active);
      p.idle.dataset.state = String(row.state);
      setText(p.idle, idleText(now - row.last_active, row.state));
    } else {
      delete p.idle.dataset.since;
      setText(p.idle, item ? row.state : row.state === "stopping" ? "stopping" : "active");
    }
    setText(p.cpu, !item && isNum(row.cpu_s) && row.cpu_s >= 0.05 ? `cpu ${cpuText(row.cpu_s)}` : "");
    p.stackBtn.hidden = item;
    p.stopBtn.hidden = item;
    if (!item) {
      p.stackBtn.dataset.tid = String(row.tid);
      p.stopBtn.dataset.tid = String(row.tid);
      p.stopBtn.title = `Stop this thread (${row.tid})`;
      setText(p.stackBtn, ui.stacks.has(row.tid) ? "hide stack" : "stack");
      button(p.stopBtn, `thread:${row.tid}`, "stop", "stopping…");
      if (ui.stale && !p.stackBtn.disabled) p.stackBtn.disabled = true;
    }
    const open = !item && ui.stacks.has(row.tid);
    p.pre.hidden = !open;
    if (open) {
      const text = stackText(row);
      if (p.pre.textContent !== text) p.pre.textContent = text;
    }
  }

  /** The expanded row: the full name, then the stacks. @param {any} row */
  function stackText(row) {
    const stack = get("stack");
    const lines = [`${safe(row.name)} (${safe(row.tid)})`];
    if (!stack || stack.tid !== row.tid) {
      lines.push("asking the kernel for the stack…");
      return lines.join("\n");
    }
    lines.push("Current stack (innermost last):");
    lines.push(...(stack.stack && stack.stack.length ? stack.stack.map((/** @type {string} */ l) => `  ${safe(l)}`)
      : ["  (not running Python code)"]));
    if (stack.creation && stack.creation.length) {
      lines.push("Started from (innermost first):");
      lines.push(...stack.creation.map((/** @type {string} */ l) => `  ${safe(l)}`));
    }
    return lines.join("\n");
  }

  function onFilter() {
    ui.filter = filterBox.value.trim().toLowerCase();
    v.mark("threads");
  }
  filterBox.addEventListener("input", onFilter);
  return { els: [threadSec], draw: drawThreads, dispose: () => filterBox.removeEventListener("input", onFilter) };
}

/**
 * TensorFlow sessions: stuck runners as sentences, the working ones per queue, a restart.
 * @param {View} v
 * @returns {Section}
 */
function sessionsSection(v) {
  const { ui, get, kernelNow, button } = v;
  const sessionSec = h("div", "nbc-sec");
  sessionSec.dataset.section = "sessions";
  const sessionList = h("div", "");
  sessionSec.append(h("div", "nbc-sec-title", "TensorFlow sessions"), sessionList);
  /** @type {Map<string, Keyed>} */
  const sessionNodes = new Map();

  function drawSessions() {
    const sessions = get("sessions") || [];
    sessionSec.hidden = !sessions.length;
    const now = kernelNow();
    reconcile(sessionList, sessionNodes, sessions, (x) => String(x.id),
      (x) => `${JSON.stringify(x)}|${ui.pending.has(`restart:${x.id}`)}|${ui.stale ? 1 : 0}`,
      () => /** @type {Keyed} */ (h("div", "nbc-sess")), (node, x) => updateSession(node, x, now));
  }

  /** @param {Keyed} node @param {any} x @param {number} now */
  function updateSession(node, x, now) {
    const line = h("div", "nbc-ghead");
    const where = isNum(x.cell) ? ` · cell [${x.cell}]` : "";
    line.append(h("span", "nbc-code", `session ${x.id}`), h("span", "nbc-muted nbc-small",
      `${x.target ? `${x.target} · ` : ""}${plural(x.runner_threads || 0, "runner thread")}${where}${x.closed ? " · closed" : ""}`));
    if (x.stuck_runners) line.append(h("span", "nbc-chip err", `${x.stuck_runners} stuck`));
    line.append(h("span", "nbc-spacer"));
    if (x.restartable) {
      const restart = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn"));
      restart.dataset.action = "restart";
      restart.dataset.session = String(x.id);
      restart.title = "Stop this session's queue runners, reset the queues that closed, and start the runners again";
      button(restart, `restart:${x.id}`, "Restart runners", "Restarting…");
      line.append(restart);
    }
    const kids = [line];
    const runners = x.runners || [];
    const stuck = runners.filter((/** @type {any} */ r) => r.stuck);
    for (const r of stuck.slice(0, MAX_RUNNERS_SHOWN)) {
      const sentence = h("div", "nbc-small nbc-kids nbc-why nbc-sentence", sinceText(r, now));
      sentence.title = safe(r.name);
      if (isNum(r.since) && typeof r.text === "string" && r.text.includes("{duration}")) {
        sentence.dataset.blocked = JSON.stringify([r.text, r.since]);
      }
      kids.push(sentence);
    }
    if (stuck.length > MAX_RUNNERS_SHOWN) {
      kids.push(h("div", "nbc-small nbc-kids nbc-muted", `… and ${stuck.length - MAX_RUNNERS_SHOWN} more stuck runner threads`));
    }
    // The runners that work, per queue: a count and their names on hover.
    /** @type {Map<string, any[]>} */
    const byQueue = new Map();
    for (const r of runners) if (!r.stuck) push(byQueue, String(r.queue_name ?? "?"), r);
    for (const [queue, list] of byQueue) {
      const line = h("div", "nbc-small nbc-kids nbc-muted nbc-line", `queue ${queue}: ${plural(list.length, "runner thread")} working`);
      line.title = safe(list.map((/** @type {any} */ r) => `${r.name}${r.role ? ` (${r.role})` : ""}`).join("\n"), true);
      kids.push(line);
    }
    node.replaceChildren(...kids);
  }
  return { els: [sessionSec], draw: drawSessions };
}

/**
 * Blocked runs as sentences (identical ones merged), queues with fill bars and sparklines.
 * @param {View} v
 * @returns {Section}
 */
function queuesSection(v) {
  const { get, kernelNow } = v;
  const queueSec = h("div", "nbc-sec");
  queueSec.dataset.section = "queues";
  const blockedList = h("div", "");
  const queueList = h("div", "");
  queueSec.append(h("div", "nbc-sec-title", "Queues"), blockedList, queueList);
  /** @type {Map<string, Keyed>} */
  const queueNodes = new Map();
  /** @type {Map<string, Keyed>} */
  const blockedNodes = new Map();

  function drawQueues() {
    const queues = get("queues") || [];
    const blocked = (get("blocked") || []).filter((/** @type {any} */ b) => b && typeof b.text === "string");
    queueSec.hidden = !queues.length && !blocked.length;
    if (queueSec.hidden) return;
    const history = (get("history") || {}).queues || {};
    const now = kernelNow();
    /** @type {any[]} */
    const lines = blocked.slice(0, MAX_BLOCKED);
    if (blocked.length > MAX_BLOCKED) lines.push({ more: blocked.length - MAX_BLOCKED, text: "" });
    reconcile(blockedList, blockedNodes, lines, (b) => (b.more ? "more" : b.text), (b) => JSON.stringify(b),
      () => /** @type {Keyed} */ (h("div", "")), (node, b) => {
        if (b.more) {
          setClass(node, "nbc-small nbc-muted nbc-kids");
          setText(node, `… and ${b.more} more blocked runs`);
          return;
        }
        setClass(node, "nbc-sentence");
        const times = isNum(b.count) && b.count > 1 ? ` (×${b.count})` : "";
        node.dataset.times = times;
        setText(node, `${sinceText(b, now)}${times}`);
        if (isNum(b.since) && b.text.includes("{duration}")) node.dataset.blocked = JSON.stringify([b.text, b.since]);
      });
    reconcile(queueList, queueNodes, queues, (q) => String(q.id ?? q.name),
      (q) => `${JSON.stringify(q)}|${JSON.stringify(history[String(q.id ?? q.name)] || [])}|${Math.floor(now / 10)}`,
      () => /** @type {Keyed} */ (h("div", "nbc-q")), (node, q) => updateQueue(node, q, history, now));
  }

  /** @param {Keyed} row @param {any} q @param {any} history @param {number} now */
  function updateQueue(row, q, history, now) {
    const name = h("span", "nbc-name nbc-code", q.name);
    name.title = safe(q.name);
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
    if (isNum(q.stuck_runners) && q.stuck_runners) parts.push(`${q.stuck_runners} stuck`);
    const info = h("span", `nbc-small ${q.closed || q.stuck_runners ? "nbc-why" : "nbc-muted"}`, parts.join(" · "));
    const points = series(history[String(q.id ?? q.name)] || [], 1, now);
    const label = `${q.name}: fill level, last ${HISTORY_WINDOW_S / 60} min`;
    const range = h("span", "nbc-small nbc-muted nbc-range", rangeText(points, (v) => String(Math.round(v)), size));
    range.dataset.range = "queue";
    row.replaceChildren(name, barBox, level, info, sparkline(points, now, bounded ? q.capacity : null, label), range);
  }
  return { els: [queueSec], draw: drawQueues };
}

/**
 * Memory: the kernel's, each GPU's, what cells still hold, child processes.
 * @param {View} v
 * @returns {Section}
 */
function memorySection(v) {
  const { get, kernelNow } = v;
  const memorySec = h("div", "nbc-sec");
  memorySec.dataset.section = "memory";
  const memoryList = h("div", "");
  memorySec.append(h("div", "nbc-sec-title", "Memory"), memoryList);
  /** @type {Map<string, Keyed>} */
  const memoryNodes = new Map();


  function drawMemory() {
    const res = get("resources");
    // What cells still hold, and what they took and gave back when it was much (64 MiB or more).
    const cellMemory = (get("cell_memory") || []).filter((/** @type {any} */ m) => memoryText(m)
      && (m.held || memoryGrowth(m) >= 64 * (1 << 20)));
    memorySec.hidden = !res && !cellMemory.length;
    if (memorySec.hidden) return;
    const history = (get("history") || {}).memory || [];
    const now = kernelNow();
    const cells = new Map((get("cells") || []).map((/** @type {any} */ c) => [c.n, c]));
    /** @type {Array<{key: string, sig: string, cls?: string, build: () => (HTMLElement | SVGElement)[]}>} */
    const items = [];
    const host = (res && res.host) || {};
    const slot = Math.floor(now / 10);
    if (isNum(host.rss)) {
      items.push({ key: "host", sig: `${JSON.stringify(host)}|${JSON.stringify(history)}|${slot}`, build: () => {
        const note = [`${bytes(host.rss)} resident`];
        if (isNum(host.total)) note.push(`of ${bytes(host.total)}`);
        if (isNum(host.children_rss) && host.children_rss > 0) note.push(`· children ${bytes(host.children_rss)}`);
        const points = series(history, 1, now);
        const range = h("span", "nbc-small nbc-muted nbc-range", rangeText(points, bytes, host.rss));
        range.dataset.range = "memory";
        return [h("span", "", "Kernel (host)"), bar(isNum(host.total) && host.total ? host.rss / host.total : null,
          `kernel RSS ${bytes(host.rss)}`), h("span", "nbc-small nbc-muted", note.join(" ")),
        sparkline(points, now, null, "kernel RSS, last 10 min"), range];
      } });
    }
    const gpu = (res && res.gpu) || {};
    for (const dev of gpu.devices || []) {
      items.push({ key: `gpu${dev.index}`, sig: `${JSON.stringify(dev)}|${JSON.stringify(history)}|${slot}`, build: () => {
        const note = [`${bytes(dev.used)} of ${bytes(dev.total)} used`];
        if (isNum(dev.process_used)) note.push(`· this kernel ${bytes(dev.process_used)}`);
        if (isNum(dev.tf_current)) note.push(`· TensorFlow ${bytes(dev.tf_current)}`);
        const label = h("span", "nbc-name", `GPU ${dev.index} ${dev.name || ""}`);
        label.title = safe(dev.name || "");
        const points = series(history, 2, now);
        const range = h("span", "nbc-small nbc-muted nbc-range", rangeText(points, bytes, dev.used));
        return [label, bar(isNum(dev.total) && dev.total ? dev.used / dev.total : null, `GPU ${dev.index} used`),
          h("span", "nbc-small nbc-muted", note.join(" ")),
          sparkline(points, now, isNum(dev.total) ? dev.total : null, "GPU memory used, last 10 min"), range];
      } });
    }
    const notes = [];
    if (!(gpu.devices || []).length && gpu.reason) notes.push(`GPU: ${gpu.reason}`);
    if (gpu.tf_note) notes.push(gpu.tf_note);
    for (const [i, note] of notes.entries()) {
      items.push({ key: `note${i}`, sig: note, build: () => [h("span", "nbc-small nbc-muted", note)] });
    }
    for (const m of cellMemory) {
      const cell = cells.get(m.cell);
      items.push({ key: `cell${m.cell}`, cls: "nbc-cellmem", sig: JSON.stringify([m, cell && cell.line]), build: () => {
        const line = h("span", `nbc-small ${m.held ? "nbc-why" : "nbc-muted"}`, `cell [${m.cell}]: ${memoryText(m)}`);
        const code = h("span", "nbc-small nbc-code nbc-muted nbc-line", cell ? cell.line : "");
        return [line, code];
      } });
    }
    const kids = (res && res.children) || [];
    if (kids.length) {
      items.push({ key: "kids", sig: JSON.stringify(kids), build: () => {
        const out = [h("div", "nbc-small", `${plural(kids.length, "child process", "child processes")}:`)];
        for (const c of kids) {
          const where = isNum(c.cell) ? ` · cell [${c.cell}]` : "";
          const line = h("div", `nbc-small nbc-code nbc-kids nbc-line${c.status === "zombie" ? " nbc-why" : ""}`,
            `${c.pid} ${c.status} ${bytes(c.rss)}${where} · ${c.cmdline}`);
          line.title = safe(c.cmdline);
          out.push(line);
        }
        return out;
      } });
    }
    reconcile(memoryList, memoryNodes, items, (x) => x.key, (x) => x.sig,
      (x) => /** @type {Keyed} */ (h("div", x.cls || (x.key === "host" || x.key.startsWith("gpu") ? "nbc-mem" : ""))),
      (node, x) => node.replaceChildren(...x.build()));
  }
  return { els: [memorySec], draw: drawMemory };
}

/**
 * Thread failures, newest first, each traceback on demand.
 * @param {View} v
 * @returns {Section}
 */
function failuresSection(v) {
  const { ui, get } = v;
  const failureSec = h("div", "nbc-sec");
  failureSec.dataset.section = "failures";
  const failureList = h("div", "");
  failureSec.append(h("div", "nbc-sec-title", "Thread failures"), failureList);
  /** @type {Map<string, Keyed>} */
  const failureNodes = new Map();

  function drawFailures() {
    const failures = (get("failures") || []).slice().reverse();
    failureSec.hidden = !failures.length;
    reconcile(failureList, failureNodes, failures, (f) => `${f.at}-${f.thread_name}`,
      (f) => `${JSON.stringify(f)}|${ui.tracebacks.has(`${f.at}-${f.thread_name}`)}`,
      () => /** @type {Keyed} */ (h("div", "")), (node, f) => {
        const key = `${f.at}-${f.thread_name}`;
        const line = h("div", "nbc-ghead nbc-small");
        line.dataset.action = "toggle-traceback";
        line.dataset.key = key;
        line.append(h("span", "nbc-caret", ui.tracebacks.has(key) ? "▾" : "▸"),
          h("span", "nbc-code", f.thread_name),
          h("span", "nbc-muted", isNum(f.cell) ? `cell [${f.cell}]` : ""),
          h("span", "nbc-why nbc-line", `${f.exc_type}: ${f.message}`));
        const parts = [line];
        if (ui.tracebacks.has(key)) {
          const pre = h("div", "nbc-pre");
          pre.textContent = safe(f.traceback, true);
          parts.push(pre);
        }
        node.replaceChildren(...parts);
      });
  }
  return { els: [failureSec], draw: drawFailures };
}

/**
 * The last stop: true counts, what is still alive, whether the running cell was interrupted.
 * @param {View} v
 * @returns {Section}
 */
function lastStopSection(v) {
  const { ui, get, kernelNow, button } = v;
  const lastSec = h("div", "nbc-sec");
  lastSec.dataset.section = "last-stop";
  const lastTitle = h("div", "nbc-sec-title");
  const lastLabel = h("span", "");
  const lastAgo = h("span", "nbc-muted nbc-small");
  lastTitle.append(lastLabel, lastAgo);
  const lastBody = h("div", "");
  lastSec.append(lastTitle, lastBody);

  function drawLastStop() {
    const last = get("last_stop");
    lastSec.hidden = !last;
    if (!last) return;
    const scope = last.scope === "cell" ? `cell [${last.cell}]` : last.scope;
    setText(lastLabel, `Last stop (${scope}${last.interrupt ? ", and the running cell" : ""})`);
    if (isNum(last.started_at)) {
      lastAgo.dataset.ago = String(last.started_at);
      setText(lastAgo, `${duration(kernelNow() - last.started_at)} ago, at ${clockTime(last.started_at)}`);
    }
    const alive = last.alive || [];
    const aliveCount = isNum(last.alive_count) ? last.alive_count : alive.length;
    const stoppedCount = isNum(last.stopped_count) ? last.stopped_count : (last.stopped || []).length;
    const summary = h("div", "nbc-small");
    summary.append(h("span", `nbc-chip ${aliveCount ? "err" : "ok"}`, `${stoppedCount} stopped, ${aliveCount} still alive`),
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
    const parts = [summary];
    const interrupt = last.interrupt;
    if (interrupt && isNum(interrupt.cell)) {
      parts.push(h("div", "nbc-small", interrupt.sent
        ? `Interrupted cell [${interrupt.cell}], which was still running.`
        : `Cell [${interrupt.cell}] was not interrupted: ${interrupt.why}.`));
    }
    if (isNum(last.items_stopped) && last.items_stopped) parts.push(h("div", "nbc-small", `${plural(last.items_stopped, "task")} stopped too.`));
    if (alive.length) {
      const list = h("div", "nbc-scroll short");
      list.dataset.scroll = "alive";
      const shown = ui.showAllAlive ? alive : alive.slice(0, MAX_ALIVE_SHOWN);
      for (const a of shown) list.appendChild(h("div", "nbc-small nbc-kids nbc-why", `${a.name} (${a.tid}): ${a.reason}`));
      parts.push(list);
      if (shown.length < aliveCount) {
        const more = h("div", "nbc-more nbc-small nbc-muted");
        more.append(h("span", "", `Showing ${shown.length} of ${aliveCount} still alive.`));
        if (shown.length < alive.length) {
          const all = h("button", "nbc-link", `Show ${alive.length}`);
          all.dataset.action = "expand-alive";
          more.append(all);
        }
        parts.push(more);
      }
    }
    for (const i of last.items_alive || []) {
      parts.push(h("div", "nbc-small nbc-kids nbc-why", `${i.label} (${i.id}): ${i.reason || "still running"}`));
    }
    for (const e of last.stopper_errors || []) {
      parts.push(h("div", "nbc-small nbc-kids nbc-why", `stopper ${e.stopper} failed: ${e.error}`));
    }
    if (aliveCount && !last.force) {
      const force = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn"));
      force.dataset.action = "force";
      force.title = "Raise ThreadStopped in the threads still running Python code";
      button(force, "force", "force stop", "forcing…");
      parts.push(force);
    }
    const scrollBox = lastBody.querySelector("[data-scroll]");
    const top = scrollBox ? scrollBox.scrollTop : 0;
    lastBody.replaceChildren(...parts);
    const box = lastBody.querySelector("[data-scroll]");
    if (box && top) box.scrollTop = top;
  }
  return { els: [lastSec], draw: drawLastStop };
}

/**
 * The last restart of a session's runners, or the last reclaim of memory.
 * @param {View} v
 * @returns {Section}
 */
function outcomeSection(v) {
  const { get, kernelNow } = v;
  const outcomeSec = h("div", "nbc-sec");
  outcomeSec.dataset.section = "outcome";
  const outcomeTitle = h("div", "nbc-sec-title");
  const outcomeLabel = h("span", "");
  const outcomeAgo = h("span", "nbc-muted nbc-small");
  outcomeTitle.append(outcomeLabel, outcomeAgo);
  const outcomeText = h("div", "nbc-pre");
  outcomeSec.append(outcomeTitle, outcomeText);

  function drawOutcome() {
    const outcome = get("outcome");
    outcomeSec.hidden = !outcome;
    if (!outcome) return;
    // A stop click appears here only when it was refused (too many different stops waited); its report is below.
    const what = outcome.kind === "restart" ? `Last restart (session ${safe(outcome.session || "?")})`
      : outcome.kind === "stop" ? "Last stop click" : "Last reclaim";
    setText(outcomeLabel, `${what}${outcome.refused ? ": refused" : outcome.ok === false ? ": failed" : ""}`);
    if (isNum(outcome.started_at)) {
      outcomeAgo.dataset.ago = String(outcome.started_at);
      setText(outcomeAgo, `${duration(kernelNow() - outcome.started_at)} ago, at ${clockTime(outcome.started_at)}`);
    }
    const text = safe(outcome.text || (outcome.errors || []).join("\n"), true);
    if (outcomeText.textContent !== text) outcomeText.textContent = text;
    setClass(outcomeText, `nbc-pre${outcome.ok === false ? " nbc-why" : ""}`);
  }
  return { els: [outcomeSec], draw: drawOutcome };
}

// ------------------------------------------------------------------------------------------- render
/**
 * @param {{ model: any, el: HTMLElement }} ctx
 * @returns {() => void} cleanup
 */
function render({ model, el }) {
  const viewId = newViewId();
  let clicks = 0;
  /** Per-view UI state, kept across updates. */
  const ui = {
    closedGroups: new Set(),
    /** groups whose rows are all drawn (else the first ROWS_PER_GROUP) */
    expanded: new Set(),
    stacks: new Set(),
    tracebacks: new Set(),
    filter: "",
    showAllAlive: false,
    /** @type {Map<string, {click_id: string, at: number, acked: boolean}>} clicks waiting for their answer, by action */
    pending: new Map(),
    /** @type {Set<string>} the last click ids the kernel acknowledged */
    acked: new Set(),
    offsetMs: 0,
    lastUpdate: performance.now(),
    /** kernel time of the last message from the kernel */
    lastHeard: Date.now() / 1000,
    /** kernel time at which the page's kernel status last turned busy */
    busySince: /** @type {number | null} */ (null),
    /** @type {string | null} nbcoord's server page, once the server says it is there */
    fleet: null,
    /** @type {{at: number, why: string} | null} set once the kernel of this view is gone */
    stale: null,
  };

  const root = h("div", "nbc");
  root.setAttribute("data-nbcoord", "panel");
  const style = h("style");
  style.textContent = CSS;
  const body = h("div", "nbc-body");

  /** @param {string} name */
  const get = (name) => model.get(name);
  /** Kernel time, seconds; frozen once the kernel is gone (its threads' idle times no longer mean anything). */
  const kernelNow = () => (Date.now() + ui.offsetMs) / 1000;
  const frozenNow = () => (ui.stale ? Math.min(ui.stale.at, kernelNow()) : kernelNow());
  const nextClickId = () => `${viewId}-${++clicks}`;
  /** @type {Set<ReturnType<typeof setTimeout>>} */
  const timers = new Set();

  /**
   * Send a command; never throws (a view whose kernel is gone turns stale instead).
   * @param {Record<string, unknown>} command @returns {string | null} the click id, or null if not sent
   */
  function send(command) {
    if (ui.stale) return null;
    const content = { ...command, click_id: nextClickId() };
    try {
      sendCommand(model, content);
    } catch (err) {
      goStale(`the kernel connection refused a message (${err instanceof Error ? err.message : String(err)})`);
      return null;
    }
    return /** @type {string} */ (content.click_id);
  }

  /**
   * An action (stop, restart, reclaim): sent once, its button shows it waits until its answer arrives.
   * @param {string} key which button waits @param {Record<string, unknown>} command
   */
  function act(key, command) {
    if (ui.pending.has(key)) return;
    const clickId = send({ ...command, clicked_at: Date.now() });
    if (clickId === null) return;
    ui.pending.set(key, { click_id: clickId, at: performance.now(), acked: false });
    mark("head", "threads", "sessions", "last", "status", "memory");
    const timer = setTimeout(() => {
      timers.delete(timer);
      mark("status");
    }, ACK_MS + 10);
    timers.add(timer);
  }

  /**
   * A button's label and state: waiting while its click is unanswered, disabled once the kernel is gone.
   * @param {HTMLButtonElement} node @param {string} key @param {string} idle @param {string} busy
   */
  function button(node, key, idle, busy) {
    const waiting = ui.pending.has(key);
    setText(node, waiting ? busy : idle);
    node.classList.toggle("busy", waiting);
    const disabled = ui.stale !== null;
    if (node.disabled !== disabled) node.disabled = disabled;
  }

  /** @type {View} */
  const v = { model, ui, get, kernelNow, frozenNow, send, mark, button };
  const parts = {
    head: headSection(v), status: statusSection(v), threads: threadsSection(v), sessions: sessionsSection(v),
    queues: queuesSection(v), memory: memorySection(v), failures: failuresSection(v), last: lastStopSection(v),
    outcome: outcomeSection(v),
  };
  body.append(...parts.threads.els, ...parts.sessions.els, ...parts.queues.els, ...parts.memory.els,
    ...parts.failures.els, ...parts.last.els, ...parts.outcome.els);
  root.append(style, ...parts.head.els, ...parts.status.els, body);
  el.appendChild(root);

  // ------------------------------------------------------------------------------------------ schedule
  const dirty = new Set(ALL_SECTIONS);
  let scheduled = false;
  /** @param {...string} sections */
  function mark(...sections) {
    for (const section of sections) dirty.add(section);
    if (scheduled) return;
    scheduled = true;
    queueMicrotask(draw);
  }

  function draw() {
    scheduled = false;
    settlePending();
    for (const section of ALL_SECTIONS) {
      if (!dirty.has(section)) continue;
      dirty.delete(section);
      parts[/** @type {keyof typeof parts} */ (section)].draw();
    }
  }

  /** Clicks that have their answer: the stop's report, or the restart's or reclaim's outcome. */
  function settlePending() {
    const last = get("last_stop");
    const outcome = get("outcome");
    const answered = new Set([
      ...((last && (last.click_ids || [last.click_id])) || []),
      ...((outcome && (outcome.click_ids || [outcome.click_id])) || []),
    ]);
    for (const [key, pending] of ui.pending) {
      if (answered.has(pending.click_id)) ui.pending.delete(key);
      else if (ui.acked.has(pending.click_id)) pending.acked = true;
    }
  }

  /** Every second: the figures that move on their own, and the banners. */
  function tick() {
    checkKernel();
    const now = kernelNow();
    const frozen = frozenNow();
    for (const node of root.querySelectorAll("[data-since]")) {
      const item = /** @type {HTMLElement} */ (node);
      setText(item, idleText(frozen - Number(item.dataset.since), String(item.dataset.state)));
    }
    for (const node of root.querySelectorAll("[data-ago]")) {
      const item = /** @type {HTMLElement} */ (node);
      const at = Number(item.dataset.ago);
      setText(item, `${duration(now - at)} ago, at ${clockTime(at)}`);
    }
    for (const node of root.querySelectorAll("[data-blocked]")) {
      const item = /** @type {HTMLElement} */ (node);
      const [text, since] = JSON.parse(String(item.dataset.blocked));
      setText(item, `${sinceText({ text, since }, frozen)}${item.dataset.times || ""}`);
    }
    parts.status.draw();
  }

  // ------------------------------------------------------------------------------------------- stale
  /** @param {string} why */
  function goStale(why) {
    if (ui.stale) return;
    ui.stale = { at: kernelNow(), why };
    ui.pending.clear();
    root.classList.add("stale");
    root.setAttribute("aria-disabled", "true");
    for (const node of root.querySelectorAll("button")) /** @type {HTMLButtonElement} */ (node).disabled = true;
    mark(...ALL_SECTIONS);
  }

  const kernelAtStart = kernelOf(model);
  /** The page's kernel connection says the kernel is gone, or the widget's comm is dead. */
  function checkKernel() {
    if (ui.stale) return;
    if (el.closest(".jupyter-widgets-disconnected") || root.closest(".jupyter-widgets-disconnected")) {
      goStale("the widget lost its kernel: it was restarted or shut down");
      return;
    }
    const kernel = kernelOf(model);
    if (kernelAtStart && kernel !== kernelAtStart) {
      goStale("the notebook changed kernels");
      return;
    }
    if (kernel && (kernel.isDisposed || ["dead", "restarting", "autorestarting"].includes(kernel.status))) {
      goStale(kernel.status === "dead" ? "the kernel died" : "the kernel restarted");
    }
  }

  /**
   * A shutdown reply on iopub: the kernel is going away (a restart or shutdown asked by any client, the REST API
   * included, which the page's kernel status does not show).
   * @param {unknown} _sender @param {any} msg
   */
  function onIopub(_sender, msg) {
    if (msg && msg.header && msg.header.msg_type === "shutdown_reply") {
      goStale(msg.content && msg.content.restart ? "the kernel restarted" : "the kernel was shut down");
    }
  }

  /** @param {unknown} _sender @param {string} state */
  function onKernelStatus(_sender, state) {
    if (state === "busy") {
      if (ui.busySince === null) ui.busySince = kernelNow();
    } else if (state === "idle") {
      ui.busySince = null;
    }
    if (["dead", "restarting", "autorestarting"].includes(state)) checkKernel();
    mark("status");
  }

  // ------------------------------------------------------------------------------------------- events
  /** @param {Event} event */
  function onClick(event) {
    const target = /** @type {HTMLElement | null} */ (event.target instanceof Element ? event.target.closest("[data-action]") : null);
    if (!target || !root.contains(target)) return;
    const action = target.dataset.action;
    if (ui.stale && action && (action.startsWith("stop") || ["force", "restart", "reclaim", "stack"].includes(action))) return;
    if (action === "stop-all") act("all", { type: "stop", scope: "all", interrupt: true });
    else if (action === "stop-background") act("background", { type: "stop", scope: "all" });
    else if (action === "stop-zombies") act("zombies", { type: "stop", scope: "zombies" });
    else if (action === "stop-cell") act(`cell:${target.dataset.cell}`, { type: "stop", scope: "cell", cell: Number(target.dataset.cell) });
    else if (action === "stop-thread") act(`thread:${target.dataset.tid}`, { type: "stop", scope: "thread", tid: target.dataset.tid });
    else if (action === "restart") act(`restart:${target.dataset.session}`, { type: "restart", session: target.dataset.session });
    else if (action === "reclaim") act("reclaim", { type: "reclaim" });
    else if (action === "force") {
      const last = get("last_stop") || {};
      /** @type {Record<string, unknown>} */
      const scope = { type: "stop", scope: last.scope || "all", force: true };
      if (last.scope === "cell") scope.cell = last.cell;
      if (last.scope === "thread") {
        const alive = last.alive || [];
        if (!alive.length) return;
        scope.tid = alive[0].tid;
      }
      act("force", scope);
    } else if (action === "stack") {
      event.stopPropagation();
      const tid = String(target.dataset.tid);
      if (ui.stacks.has(tid)) ui.stacks.delete(tid);
      else {
        ui.stacks.add(tid);
        send({ type: "stack", tid });
      }
      mark("threads");
    } else if (action === "toggle-group") {
      if (event.target instanceof Element && event.target.closest("button")) return;
      toggle(ui.closedGroups, String(target.dataset.group));
      mark("threads");
    } else if (action === "expand-group") {
      ui.expanded.add(String(target.dataset.group));
      mark("threads");
    } else if (action === "collapse-group") {
      ui.expanded.delete(String(target.dataset.group));
      mark("threads");
    } else if (action === "expand-alive") {
      ui.showAllAlive = true;
      mark("last");
    } else if (action === "toggle-traceback") {
      toggle(ui.tracebacks, String(target.dataset.key));
      mark("failures");
    }
  }

  /** @param {Set<string>} set @param {string} key */
  function toggle(set, key) {
    if (set.has(key)) set.delete(key);
    else set.add(key);
  }

  /** @param {string} name */
  function onChange(name) {
    if (name === "ack") {
      const ack = get("ack");
      // One acknowledgement names the last clicks acknowledged: in a flood the kernel sends one for many.
      const ids = ack && Array.isArray(ack.click_ids) ? ack.click_ids : [ack && ack.click_id];
      for (const id of ids) {
        if (typeof id !== "string") continue;
        ui.acked.add(id);
        if (ui.acked.size > 64) ui.acked.delete(ui.acked.values().next().value);
      }
    }
    ui.lastUpdate = performance.now();
    ui.lastHeard = kernelNow();
    mark(...(SECTIONS_OF[name] || []));
  }

  function onClock() {
    const clock = get("clock");
    if (clock && clock.view_id === viewId && isNum(clock.client_time) && isNum(clock.kernel_time)) {
      // Half the round trip is the best guess of when the kernel read its clock.
      const mid = (clock.client_time + Date.now()) / 2;
      ui.offsetMs = clock.kernel_time * 1000 - mid;
    }
    onChange("clock");
  }

  function onLive() {
    // The widget manager marks the view after this event's other listeners: look once they ran.
    queueMicrotask(checkKernel);
    const timer = setTimeout(() => {
      timers.delete(timer);
      checkKernel();
    }, 0);
    timers.add(timer);
  }

  /** @type {Array<[string, () => void]>} */
  const listeners = TRAITS.map((name) => [`change:${name}`, name === "clock" ? onClock : () => onChange(name)]);
  listeners.push(["comm_live_update", onLive]);
  for (const [event, callback] of listeners) model.on(event, callback);
  const kernel = kernelAtStart;
  /** @type {Array<[any, (sender: unknown, value: any) => void]>} the kernel connection's signals we follow */
  const signals = [];
  for (const [name, slot] of /** @type {Array<[string, (sender: unknown, value: any) => void]>} */ (
    [["statusChanged", onKernelStatus], ["iopubMessage", onIopub]])) {
    const signal = kernel && kernel[name];
    if (!signal || typeof signal.connect !== "function") continue;
    try {
      signal.connect(slot);
      signals.push([signal, slot]);
    } catch (err) {
      // a kernel connection of another shape: the ticker still polls its status
    }
  }
  if (kernel && kernel.status === "busy") ui.busySince = kernelNow();
  root.addEventListener("click", onClick);
  const ticker = setInterval(tick, TICK_MS);
  const renew = setInterval(() => send({ type: "view", view_id: viewId, action: "alive" }), RENEW_MS);
  send({ type: "view", view_id: viewId, action: "open", client_time: Date.now() });
  checkKernel();
  draw();
  // The link to the server page only where the server has nbcoord's extension (HEAD /nbcoord/ answers 200).
  const fleet = fleetUrl();
  if (fleet) {
    fetch(fleet, { method: "HEAD", credentials: "same-origin" })
      .then((response) => {
        if (response.ok) {
          ui.fleet = fleet;
          mark("head");
        }
      })
      .catch(() => {});
  }

  return () => {
    clearInterval(ticker);
    clearInterval(renew);
    for (const timer of timers) clearTimeout(timer);
    for (const [event, callback] of listeners) model.off(event, callback);
    for (const [signal, slot] of signals) {
      try {
        signal.disconnect(slot);
      } catch (err) {
        // already disposed with its kernel
      }
    }
    root.removeEventListener("click", onClick);
    for (const part of Object.values(parts)) if (part.dispose) part.dispose();
    send({ type: "view", view_id: viewId, action: "close" });
    root.remove();
  };
}

export default { render };
