// @ts-check
import { bytes, h, isNum, plural } from "../../shared/text.js";
import { setClass, setText } from "../dom.js";
import { bar } from "../svg.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */
/** @typedef {import("../dom.js").Keyed} Keyed */

/**
 * The header: the kernel, its counts and memory, the link to the server page, the actions.
 * @param {View} v
 * @returns {Section}
 */
export function headSection(v) {
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
