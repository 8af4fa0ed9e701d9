// @ts-check
/**
 * The panel's pictures: fill bars and step sparklines over the last ten minutes, and the range under them.
 */

import { isNum, safe } from "../shared/text.js";
import { s } from "./dom.js";

/** The window of every sparkline, seconds. */
export const HISTORY_WINDOW_S = 600;

/**
 * A horizontal bar: ``fraction`` of ``width`` filled; warn and error colours near full.
 * @param {number | null} fraction
 * @param {string} label for screen readers and the tooltip
 * @param {number} [width]
 * @param {number} [height]
 * @param {boolean} [alarm] colour a nearly full bar (memory); a full queue is not an alarm by itself
 */
export function bar(fraction, label, width = 120, height = 9, alarm = true) {
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
export function series(points, col, now) {
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
export function sparkline(usable, now, top, label, width = 120, height = 22) {
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
export function rangeText(usable, format, current) {
  const values = usable.map((p) => p[1]);
  if (current !== null && isNum(current)) values.push(current);
  if (!values.length) return "";
  const now = current !== null && isNum(current) ? current : values[values.length - 1];
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  return `now ${format(now)} · range ${format(lo)}–${format(hi)}`;
}
