// @ts-check
/**
 * The panel's sentences and short forms: times of day, idle and CPU figures, zombie reasons, memory a cell took.
 */

import { bytes, duration, isNum } from "../shared/text.js";

export const ZOMBIE_WORDS = {
  "cell-interrupted": "its cell was interrupted",
  "cell-error": "its cell raised an error",
  "stop-ignored": "it ignored a stop request",
  "owner-closed": "its owner is closed",
};
/** Short forms for the row; the row's tooltip has the sentence. */
export const ZOMBIE_SHORT = {
  "cell-interrupted": "cell interrupted",
  "cell-error": "cell failed",
  "stop-ignored": "ignored stop",
  "owner-closed": "owner closed",
};

/** A wall-clock time of day, from kernel seconds. @param {number} at */
export function clockTime(at) {
  const d = new Date(at * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, "0")).join(":");
}

/** @param {number} secs */
export function cpuText(secs) {
  return secs < 10 ? `${secs.toFixed(1)} s` : `${Math.round(secs)} s`;
}

/** @param {number} idle @param {string} state */
export function idleText(idle, state) {
  if (state === "stopping") return "stopping";
  return idle >= 2 ? `idle ${duration(idle)}` : "active";
}

/**
 * A sentence whose growing duration the kernel left as "{duration}", drawn here from ``since``.
 * @param {{text: string, since?: number}} b @param {number} now
 */
export function sinceText(b, now) {
  return isNum(b.since) ? b.text.replace("{duration}", `${Math.max(0, now - b.since).toFixed(1)} s`) : b.text;
}

/** Zombie reasons in words, first cause first. @param {any} row */
export function reasonsText(row) {
  /** @type {Array<[string, number]>} */
  const reasons = Array.isArray(row.reasons) && row.reasons.length ? row.reasons : row.zombie ? [[row.zombie, NaN]] : [];
  return reasons.map(([r]) => ZOMBIE_SHORT[/** @type {keyof ZOMBIE_SHORT} */ (r)] || r).join(", then ");
}

/**
 * A zombie in words, naming its cell: "cell [3] was interrupted, then ignored a stop".
 * @param {any} row
 */
export function zombieText(row) {
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
export function reasonsTitle(row) {
  /** @type {Array<[string, number]>} */
  const reasons = Array.isArray(row.reasons) && row.reasons.length ? row.reasons : row.zombie ? [[row.zombie, NaN]] : [];
  return reasons.map(([r, since]) => `${ZOMBIE_WORDS[/** @type {keyof ZOMBIE_WORDS} */ (r)] || r}${isNum(since) ? ` (since ${clockTime(since)})` : ""}`)
    .join("\n");
}

/** The larger of a cell's GPU and RAM growth, in bytes. @param {any} m */
export function memoryGrowth(m) {
  const gpu = isNum(m.gpu_after) && isNum(m.gpu_before) ? Math.abs(m.gpu_after - m.gpu_before) : 0;
  const rss = isNum(m.rss_after) && isNum(m.rss_before) ? Math.abs(m.rss_after - m.rss_before) : 0;
  return Math.max(gpu, rss);
}

/**
 * "cell [7]: +2.1 GiB on the GPU, still held".
 * @param {any} m @param {boolean} [short]
 */
export function memoryText(m, short = false) {
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
