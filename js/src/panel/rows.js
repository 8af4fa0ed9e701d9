// @ts-check
/**
 * The panel's rows (threads, ledger, groups, cells), kept by difference: the kernel sends them in one "rows"
 * message per change (nbcoord.ui.rowsync), not as traits. Keyed sections (threads by tid, ledger rows by id) bring
 * the rows that changed and the keys removed; groups and cells come whole when they changed. A difference applies
 * only onto the message it is based on; a view that missed one (or has none yet) asks for everything, and the
 * kernel's next message is a full copy, which every view takes.
 *
 * The order of rows is not sent: they are sorted here by the kernel's key (nbcoord.ui.rows.drawn_order: zombies
 * first, then by cell, then by start, then by key), so that the draw functions read the same lists as before.
 */

/** The rows sections, and the field that keys the rows of each keyed one (nbcoord.ui.sections, ``key``). */
export const ROWS_TRAITS = ["threads", "ledger", "groups", "cells"];
/** @type {Record<string, string>} */
export const KEYS = { threads: "tid", ledger: "id" };

/**
 * @typedef {{
 *   seq: number | null, maps: Record<string, Map<string, any>>, lists: Record<string, any[]>,
 * }} RowStore
 */

/** An empty store: no message applied yet (the draw functions read the model's values meanwhile). @returns {RowStore} */
export function rowStore() {
  return { seq: null, maps: { threads: new Map(), ledger: new Map() }, lists: {} };
}

/** Whether ``n`` is a whole number the kernel may have sent as a sequence number. @param {unknown} n */
const isSeq = (n) => typeof n === "number" && Number.isSafeInteger(n) && n >= 0;

/**
 * The kernel's order (nbcoord.ui.rows.drawn_order). @param {string} key
 * @returns {(a: any, b: any) => number}
 */
function drawnOrder(key) {
  /** @param {any} row @returns {[number, number, number, string]} */
  const order = (row) => [
    row.zombie ? 0 : 1,
    Number.isInteger(row.cell) ? row.cell : 2 ** 30,
    typeof row.started_at === "number" ? row.started_at : 0,
    String(row[key]),
  ];
  return (a, b) => {
    const x = order(a);
    const y = order(b);
    for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return /** @type {number} */ (x[i]) < /** @type {number} */ (y[i]) ? -1 : 1;
    return x[3] < y[3] ? -1 : x[3] > y[3] ? 1 : 0;
  };
}

/**
 * Whether a message has the shape the kernel sends: anything else is refused whole (never half applied).
 * @param {any} msg
 */
function wellFormed(msg) {
  if (!isSeq(msg.seq) || typeof msg.full !== "boolean" || (!msg.full && !isSeq(msg.base))) return false;
  for (const trait of ROWS_TRAITS) {
    const part = msg[trait];
    if (part === undefined) continue;
    if (!(trait in KEYS)) {
      if (!Array.isArray(part)) return false;
      continue;
    }
    const key = KEYS[trait];
    if (!part || !Array.isArray(part.upsert) || !Array.isArray(part.remove)) return false;
    if (!part.upsert.every((/** @type {any} */ row) => row && typeof row === "object" && typeof row[key] === "string")) return false;
    if (!part.remove.every((/** @type {unknown} */ k) => typeof k === "string")) return false;
  }
  return true;
}

/**
 * Apply one rows message to the store.
 * @param {RowStore} store @param {any} msg
 * @returns {{changed: string[]} | {gap: true} | {bad: true} | null} the sections it changed; ``gap``: it does not
 *   follow what the store has (ask for everything); ``bad``: not a rows message of the kernel's shape; null: one
 *   already applied (an older one, or one another part of the page applied)
 */
export function applyRows(store, msg) {
  if (!msg || typeof msg !== "object" || !wellFormed(msg)) return { bad: true };
  if (store.seq !== null && msg.seq <= store.seq) return null;
  if (!msg.full && msg.base !== store.seq) return { gap: true };
  /** @type {string[]} */
  const changed = [];
  for (const trait of ROWS_TRAITS) {
    const part = msg[trait];
    if (part === undefined && !msg.full) continue;
    changed.push(trait);
    if (!(trait in KEYS)) {
      store.lists[trait] = part || [];
      continue;
    }
    const key = KEYS[trait];
    const map = store.maps[trait];
    const order = drawnOrder(key);
    const removed = (part && part.remove) || [];
    const upsert = (part && part.upsert) || [];
    // Rows that changed in place (a name, a state: not what they sort by) keep their places: no sort.
    const inPlace = !msg.full && !removed.length && trait in store.lists
      && upsert.every((/** @type {any} */ row) => map.has(row[key]) && order(map.get(row[key]), row) === 0);
    if (msg.full) map.clear();
    for (const k of removed) map.delete(k);
    for (const row of upsert) map.set(row[key], row);
    store.lists[trait] = inPlace
      ? store.lists[trait].map((/** @type {any} */ row) => map.get(row[key]))
      : [...map.values()].sort(order);
  }
  store.seq = msg.seq;
  return { changed };
}

/**
 * The value the draw functions read: the store's once it has one, else the model's (a front end that sets the
 * traits itself, as the module's tests do).
 * @param {RowStore} store @param {string} name @param {(name: string) => any} fallback
 */
export function rowValue(store, name, fallback) {
  return store.seq !== null && name in store.lists ? store.lists[name] : fallback(name);
}
