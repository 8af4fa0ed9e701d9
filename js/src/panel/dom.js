// @ts-check
/**
 * DOM helpers of the panel: set a node's text, class or title only when it changes, SVG elements, and the keyed
 * reconciliation every list of the panel uses (one node per key, touched only when its data changed).
 */

import { safe } from "../shared/text.js";

export const SVG_NS = "http://www.w3.org/2000/svg";

/**
 * Set text only when it differs (a node whose text did not change is not touched).
 * @param {Element} node
 * @param {unknown} text
 */
export function setText(node, text) {
  const value = safe(text);
  if (node.textContent !== value) node.textContent = value;
}

/** @param {Element} node @param {string} cls */
export function setClass(node, cls) {
  if (node.getAttribute("class") !== cls) node.setAttribute("class", cls);
}

/** @param {HTMLElement} node @param {unknown} title */
export function setTitle(node, title) {
  const value = safe(title, true);
  if (node.title !== value) node.title = value;
}

/**
 * @param {string} tag
 * @param {Record<string, string | number>} attrs
 * @returns {SVGElement}
 */
export function s(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

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
export function reconcile(parent, cache, items, keyOf, sigOf, create, update) {
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

/** @param {Map<string, any[]>} map @param {string} key @param {any} value */
export function push(map, key, value) {
  const list = map.get(key);
  if (list) list.push(value);
  else map.set(key, [value]);
}
