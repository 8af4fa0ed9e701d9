// @ts-check
/**
 * The text helpers nbcoord's two pages share (the panel, js/src/panel/, and the server page, js/src/fleet/):
 * escaping of control and bidirectional characters, elements whose text is always escaped, bytes, durations and
 * plurals. Defined here once; each page's bundle carries its own copy of what it uses.
 */

/** Control, format and bidirectional characters: never rendered as themselves. */
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]/g;
const UNSAFE_KEEP_LINES = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]/g;
/** @type {Record<string, string>} */
const SHORT_ESCAPES = { "\n": "\\n", "\t": "\\t", "\r": "\\r" };

/**
 * A string from the kernel or the server, with every control, format or bidirectional character shown as an
 * escape (``\u202e``), so that a name cannot hide, reorder or break the text around it.
 * @param {unknown} value
 * @param {boolean} [lines] keep newlines and tabs (tracebacks, stacks, a title of several lines)
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
export function h(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = safe(text);
  return node;
}

/** @param {unknown} n @returns {n is number} */
export function isNum(n) {
  return typeof n === "number" && Number.isFinite(n);
}

/**
 * "1.5 GiB": binary units, one decimal above bytes.
 * @param {unknown} n
 * @param {string} [missing] what a value that is not a number reads as
 */
export function bytes(n, missing = "n/a") {
  if (!isNum(n)) return missing;
  let v = n;
  for (const unit of ["B", "KiB", "MiB", "GiB"]) {
    if (Math.abs(v) < 1024) return unit === "B" ? `${v.toFixed(0)} ${unit}` : `${v.toFixed(1)} ${unit}`;
    v /= 1024;
  }
  return `${v.toFixed(1)} TiB`;
}

/**
 * "2 min 5 s", "1 h 3 min": a duration to the second, for figures that move every second (the panel).
 * @param {number} secs
 */
export function duration(secs) {
  const v = Math.max(0, secs);
  if (v < 60) return `${Math.floor(v)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min ${Math.floor(v % 60)} s`;
  return `${Math.floor(v / 3600)} h ${Math.floor((v % 3600) / 60)} min`;
}

/**
 * "2 min", "1.5 h": a duration in one unit, for a table refreshed every few seconds (the server page); empty for
 * a value that is not a duration.
 * @param {number} secs
 */
export function coarseDuration(secs) {
  if (!isNum(secs) || secs < 0) return "";
  if (secs < 60) return `${secs.toFixed(0)} s`;
  if (secs < 3600) return `${Math.floor(secs / 60)} min`;
  return `${(secs / 3600).toFixed(1)} h`;
}

/** "1 thread", "3 threads". @param {number} n @param {string} one @param {string} [many] */
export function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many || `${one}s`}`;
}
