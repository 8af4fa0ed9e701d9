// @ts-check
import { bytes, h, isNum, plural, safe } from "../../shared/text.js";
import { reconcile } from "../dom.js";
import { bar, rangeText, series, sparkline } from "../svg.js";
import { memoryGrowth, memoryText } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */
/** @typedef {import("../dom.js").Keyed} Keyed */

/**
 * Memory: the kernel's, each GPU's, what cells still hold, child processes.
 * @param {View} v
 * @returns {Section}
 */
export function memorySection(v) {
  const { get, kernelNow } = v;
  const memorySec = h("div", "nbc-sec");
  memorySec.dataset.section = "memory";
  const memoryList = h("div", "");
  memorySec.append(h("div", "nbc-sec-title", "Memory"), memoryList);
  /** @type {Map<string, Keyed>} */
  const memoryNodes = new Map();


  function drawMemory() {
    const res = get("resources");
    // What cells still hold, and what they took and gave back when it was much (64 MiB or more).
    const cellMemory = (get("cell_memory") || []).filter((/** @type {any} */ m) => memoryText(m)
      && (m.held || memoryGrowth(m) >= 64 * (1 << 20)));
    memorySec.hidden = !res && !cellMemory.length;
    if (memorySec.hidden) return;
    const history = (get("history") || {}).memory || [];
    const now = kernelNow();
    const cells = new Map((get("cells") || []).map((/** @type {any} */ c) => [c.n, c]));
    /** @type {Array<{key: string, sig: string, cls?: string, build: () => (HTMLElement | SVGElement)[]}>} */
    const items = [];
    const host = (res && res.host) || {};
    const slot = Math.floor(now / 10);
    if (isNum(host.rss)) {
      items.push({ key: "host", sig: `${JSON.stringify(host)}|${JSON.stringify(history)}|${slot}`, build: () => {
        const note = [`${bytes(host.rss)} resident`];
        if (isNum(host.total)) note.push(`of ${bytes(host.total)}`);
        if (isNum(host.children_rss) && host.children_rss > 0) note.push(`· children ${bytes(host.children_rss)}`);
        const points = series(history, 1, now);
        const range = h("span", "nbc-small nbc-muted nbc-range", rangeText(points, bytes, host.rss));
        range.dataset.range = "memory";
        return [h("span", "", "Kernel (host)"), bar(isNum(host.total) && host.total ? host.rss / host.total : null,
          `kernel RSS ${bytes(host.rss)}`), h("span", "nbc-small nbc-muted", note.join(" ")),
        sparkline(points, now, null, "kernel RSS, last 10 min"), range];
      } });
    }
    const gpu = (res && res.gpu) || {};
    for (const dev of gpu.devices || []) {
      items.push({ key: `gpu${dev.index}`, sig: `${JSON.stringify(dev)}|${JSON.stringify(history)}|${slot}`, build: () => {
        const note = [`${bytes(dev.used)} of ${bytes(dev.total)} used`];
        if (isNum(dev.process_used)) note.push(`· this kernel ${bytes(dev.process_used)}`);
        if (isNum(dev.tf_current)) note.push(`· TensorFlow ${bytes(dev.tf_current)}`);
        const label = h("span", "nbc-name", `GPU ${dev.index} ${dev.name || ""}`);
        label.title = safe(dev.name || "");
        const points = series(history, 2, now);
        const range = h("span", "nbc-small nbc-muted nbc-range", rangeText(points, bytes, dev.used));
        return [label, bar(isNum(dev.total) && dev.total ? dev.used / dev.total : null, `GPU ${dev.index} used`),
          h("span", "nbc-small nbc-muted", note.join(" ")),
          sparkline(points, now, isNum(dev.total) ? dev.total : null, "GPU memory used, last 10 min"), range];
      } });
    }
    const notes = [];
    if (!(gpu.devices || []).length && gpu.reason) notes.push(`GPU: ${gpu.reason}`);
    if (gpu.tf_note) notes.push(gpu.tf_note);
    for (const [i, note] of notes.entries()) {
      items.push({ key: `note${i}`, sig: note, build: () => [h("span", "nbc-small nbc-muted", note)] });
    }
    for (const m of cellMemory) {
      const cell = cells.get(m.cell);
      items.push({ key: `cell${m.cell}`, cls: "nbc-cellmem", sig: JSON.stringify([m, cell && cell.line]), build: () => {
        const line = h("span", `nbc-small ${m.held ? "nbc-why" : "nbc-muted"}`, `cell [${m.cell}]: ${memoryText(m)}`);
        const code = h("span", "nbc-small nbc-code nbc-muted nbc-line", cell ? cell.line : "");
        return [line, code];
      } });
    }
    const kids = (res && res.children) || [];
    if (kids.length) {
      items.push({ key: "kids", sig: JSON.stringify(kids), build: () => {
        const out = [h("div", "nbc-small", `${plural(kids.length, "child process", "child processes")}:`)];
        for (const c of kids) {
          const where = isNum(c.cell) ? ` · cell [${c.cell}]` : "";
          const line = h("div", `nbc-small nbc-code nbc-kids nbc-line${c.status === "zombie" ? " nbc-why" : ""}`,
            `${c.pid} ${c.status} ${bytes(c.rss)}${where} · ${c.cmdline}`);
          line.title = safe(c.cmdline);
          out.push(line);
        }
        return out;
      } });
    }
    reconcile(memoryList, memoryNodes, items, (x) => x.key, (x) => x.sig,
      (x) => /** @type {Keyed} */ (h("div", x.cls || (x.key === "host" || x.key.startsWith("gpu") ? "nbc-mem" : ""))),
      (node, x) => node.replaceChildren(...x.build()));
  }
  return { els: [memorySec], draw: drawMemory };
}
