// @ts-check
/**
 * One view of the panel: its per-view state, the schedule that redraws only the sections whose traits changed,
 * the clicks, the ticker, and the watch on the kernel (a view whose kernel is gone turns stale).
 */

import { duration, h, isNum } from "../shared/text.js";
import { setText } from "./dom.js";
import { fleetUrl, kernelOf, newViewId, sendCommand } from "./kernel.js";
import { applyRows, rowStore, rowValue } from "./rows.js";
import { SECTIONS, SECTIONS_OF, TRAITS } from "./sections.js";
import { CSS } from "./style.js";
import { ACK_MS } from "./view.js";
import { clockTime, idleText, sinceText } from "./words.js";

/** @typedef {import("./view.js").View} View */
/** @typedef {import("./view.js").Section} Section */

/** The sections in drawing order. */
const ALL_SECTIONS = SECTIONS.map((section) => section.name);

/** The kernel forgets a view that has not renewed for 60 s (nbcoord.ui.panel.VIEW_LEASE_S). */
const RENEW_MS = 20000;
/** A view that asked for every row and got no full copy this long after asks again. */
const ASK_ROWS_MS = 5000;
const TICK_MS = 1000;

/**
 * @param {{ model: any, el: HTMLElement }} ctx
 * @returns {() => void} cleanup
 */
export function render({ model, el }) {
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
    /** performance.now() at which the page's kernel status last turned busy */
    busyAt: /** @type {number | null} */ (null),
    /** @type {Map<string, number>} the page's execute requests without a reply yet: msg_id -> performance.now() */
    executes: new Map(),
    /** @type {string | null} nbcoord's server page, once the server says it is there */
    fleet: null,
    /** @type {{at: number, why: string} | null} set once the kernel of this view is gone */
    stale: null,
    /** @type {number | null} when this view last asked for every row (null: it has them) */
    rowsAsked: null,
    /** whether a malformed rows message was reported (once per view) */
    badRows: false,
  };
  /** The rows sections as the kernel's rows messages left them (rows.js). */
  const rows = rowStore();

  const root = h("div", "nbc");
  root.setAttribute("data-nbcoord", "panel");
  const style = h("style");
  style.textContent = CSS;
  const body = h("div", "nbc-body");

  /** @param {string} name */
  const get = (name) => rowValue(rows, name, (n) => model.get(n));
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
  /** @type {Record<string, Section>} each registered section, by name */
  const parts = {};
  for (const section of SECTIONS) parts[section.name] = section.make(v);
  const top = SECTIONS.filter((section) => section.top).flatMap((section) => parts[section.name].els);
  body.append(...SECTIONS.filter((section) => !section.top).flatMap((section) => parts[section.name].els));
  root.append(style, ...top, body);
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
      parts[section].draw();
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
    ui.executes.clear();
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
      if (ui.busyAt === null) ui.busyAt = performance.now();
    } else if (state === "idle") {
      ui.busySince = null;
      ui.busyAt = null;
    }
    if (["dead", "restarting", "autorestarting"].includes(state)) checkKernel();
    mark("status");
  }

  /**
   * The page's execute requests and their replies: a cell the page sent and the kernel has not answered is work
   * the kernel owes, even while its busy status waits behind the GIL (the page then still says idle).
   * @param {unknown} _sender @param {any} args
   */
  function onAnyMessage(_sender, args) {
    const msg = args && args.msg;
    const type = msg && msg.header && msg.header.msg_type;
    if (args.direction === "send" && type === "execute_request" && !(msg.content && msg.content.silent)) {
      ui.executes.set(String(msg.header.msg_id), performance.now());
      if (ui.executes.size > 64) ui.executes.delete(ui.executes.keys().next().value);
      mark("status");
    } else if (args.direction === "recv" && type === "execute_reply" && msg.parent_header) {
      if (ui.executes.delete(String(msg.parent_header.msg_id))) mark("status");
    }
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

  /**
   * A custom message from the kernel: the rows, by difference (rows.js); a view that cannot apply one asks for
   * every row, once per ASK_ROWS_MS.
   * @param {any} content
   */
  function onCustom(content) {
    if (!content || content.type !== "rows") return;
    const applied = applyRows(rows, content);
    if (applied === null) return;
    if ("bad" in applied) {
      if (!ui.badRows) console.warn("nbcoord: the panel ignored a malformed rows message");
      ui.badRows = true;
    } else if ("gap" in applied) {
      askRows();
    } else {
      if (content.full) ui.rowsAsked = null;
      for (const name of applied.changed) onChange(name);
    }
  }

  function askRows() {
    const now = performance.now();
    if (ui.stale || (ui.rowsAsked !== null && now - ui.rowsAsked < ASK_ROWS_MS)) return;
    if (send({ type: "view", view_id: viewId, action: "rows" }) !== null) ui.rowsAsked = now;
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

  /** @type {Array<[string, (...args: any[]) => void]>} */
  const listeners = TRAITS.map((name) => [`change:${name}`, name === "clock" ? onClock : () => onChange(name)]);
  listeners.push(["comm_live_update", onLive], ["msg:custom", onCustom]);
  for (const [event, callback] of listeners) model.on(event, callback);
  const kernel = kernelAtStart;
  /** @type {Array<[any, (sender: unknown, value: any) => void]>} the kernel connection's signals we follow */
  const signals = [];
  for (const [name, slot] of /** @type {Array<[string, (sender: unknown, value: any) => void]>} */ (
    [["statusChanged", onKernelStatus], ["iopubMessage", onIopub], ["anyMessage", onAnyMessage]])) {
    const signal = kernel && kernel[name];
    if (!signal || typeof signal.connect !== "function") continue;
    try {
      signal.connect(slot);
      signals.push([signal, slot]);
    } catch (err) {
      // a kernel connection of another shape: the ticker still polls its status
    }
  }
  if (kernel && kernel.status === "busy") {
    ui.busySince = kernelNow();
    ui.busyAt = performance.now();
  }
  root.addEventListener("click", onClick);
  const ticker = setInterval(tick, TICK_MS);
  const renew = setInterval(() => send({ type: "view", view_id: viewId, action: "alive" }), RENEW_MS);
  // Opening asks for every row too: the kernel's next rows message is a full copy.
  if (send({ type: "view", view_id: viewId, action: "open", client_time: Date.now() }) !== null) {
    ui.rowsAsked = performance.now();
  }
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
