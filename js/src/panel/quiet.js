// @ts-check
/**
 * Whether the kernel answers the panel, from what the view saw: the last update from the kernel, and what the
 * view expects an answer to (a running cell's beats, the page's busy status, an execute request the page sent,
 * a click). A kernel whose main thread holds the GIL in a C call sends nothing at all, not even the busy status
 * of the cell it runs: the page may still say idle, so the page's status alone never proves the kernel idle.
 */

import { duration, isNum } from "../shared/text.js";
import { ACK_MS } from "./view.js";

/** A kernel that has not answered this long while it should is asked about from outside (the server). */
export const ASK_MS = 2000;

/**
 * @typedef {{
 *   expecting: boolean, silentMs: number, limitMs: number, late: boolean, unanswered: boolean, notAnswering: boolean,
 *   ask: boolean, askInMs: number,
 * }} Quiet
 * expecting: a cell runs (the kernel's header), the page says busy, an execute request waits for its reply, or a
 *   click for its acknowledgement; silentMs: how long the kernel has sent nothing since the view began expecting;
 *   limitMs: how long beats may stop before that means something; late: a click past its acknowledgement
 *   deadline; unanswered: the same on a fast route (without one, a click waits for the running cell); notAnswering: the kernel does not answer (the status line and banner say so);
 *   ask: the server may be asked for the kernel's stacks; askInMs: when it may be, if not yet (Infinity: never).
 */

/**
 * @param {any} ui the view's state (render.js)
 * @param {any} header the kernel's header trait
 * @param {any} beat the kernel's beat trait
 * @param {boolean} pageBusy the page's kernel status is "busy"
 * @param {number} nowMs ``performance.now()``
 * @returns {Quiet}
 */
export function quietOf(ui, header, beat, pageBusy, nowMs) {
  const every = beat && isNum(beat.every) ? beat.every : isNum(header.interval) ? header.interval : 1;
  const limitMs = 3 * every * 1000 + 1000;
  const fast = header.route !== "none";
  const waiting = [...ui.pending.values()].filter((p) => !p.acked);
  const late = waiting.some((click) => nowMs - click.at > ACK_MS);
  // Without a fast route a click waits for the running cell: no answer to it is expected before.
  const clicks = fast ? waiting : [];
  /** @type {number[]} since when the view expects to hear from the kernel, one time per reason */
  const from = [];
  if (isNum(header.running_cell)) from.push(-Infinity);
  if (pageBusy) from.push(isNum(ui.busyAt) ? ui.busyAt : -Infinity);
  if (ui.executes && ui.executes.size) from.push(Math.min(...ui.executes.values()));
  for (const click of clicks) from.push(click.at);
  const expecting = from.length > 0;
  const silentMs = expecting ? nowMs - Math.max(ui.lastUpdate, Math.min(...from)) : 0;
  const unanswered = fast && late;
  const ask = unanswered || (expecting && silentMs >= ASK_MS);
  const askInMs = ask ? 0 : expecting ? ASK_MS - silentMs : Infinity;
  const notAnswering = unanswered || (expecting && silentMs > limitMs);
  return { expecting, silentMs, limitMs, late, unanswered, notAnswering, ask, askInMs };
}

/** "4.1 s" under a minute (a read from outside is a moment's figure), else "2 min 5 s". @param {number} secs */
export function moment(secs) {
  return secs < 60 ? `${Math.max(0, secs).toFixed(1)} s` : duration(secs);
}
