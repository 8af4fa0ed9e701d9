// @ts-check
import { h, isNum, plural, safe } from "../../shared/text.js";
import { push, reconcile, setClass, setText, setTitle } from "../dom.js";
import { clockTime, cpuText, idleText, memoryText, reasonsText, reasonsTitle, zombieText } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */
/** @typedef {import("../dom.js").Keyed} Keyed */

/** Rows drawn per group before "show all". */
export const ROWS_PER_GROUP = 50;

/**
 * Threads and tasks, grouped by the cell that started them, zombies first; a filter box.
 * @param {View} v
 * @returns {Section}
 */
export function threadsSection(v) {
  const { ui, get, frozenNow, button } = v;
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
