// @ts-check
import { h, isNum, plural, safe } from "../../shared/text.js";
import { reconcile, setClass, setText } from "../dom.js";
import { bar, HISTORY_WINDOW_S, rangeText, series, sparkline } from "../svg.js";
import { sinceText } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */
/** @typedef {import("../dom.js").Keyed} Keyed */

const MAX_BLOCKED = 5;

/**
 * Blocked runs as sentences (identical ones merged), queues with fill bars and sparklines.
 * @param {View} v
 * @returns {Section}
 */
export function queuesSection(v) {
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
