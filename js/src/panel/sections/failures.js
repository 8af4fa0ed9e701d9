// @ts-check
import { h, isNum, safe } from "../../shared/text.js";
import { reconcile } from "../dom.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */
/** @typedef {import("../dom.js").Keyed} Keyed */

/**
 * Thread failures, newest first, each traceback on demand.
 * @param {View} v
 * @returns {Section}
 */
export function failuresSection(v) {
  const { ui, get } = v;
  const failureSec = h("div", "nbc-sec");
  failureSec.dataset.section = "failures";
  const failureList = h("div", "");
  failureSec.append(h("div", "nbc-sec-title", "Thread failures"), failureList);
  /** @type {Map<string, Keyed>} */
  const failureNodes = new Map();

  function drawFailures() {
    const failures = (get("failures") || []).slice().reverse();
    failureSec.hidden = !failures.length;
    reconcile(failureList, failureNodes, failures, (f) => `${f.at}-${f.thread_name}`,
      (f) => `${JSON.stringify(f)}|${ui.tracebacks.has(`${f.at}-${f.thread_name}`)}`,
      () => /** @type {Keyed} */ (h("div", "")), (node, f) => {
        const key = `${f.at}-${f.thread_name}`;
        const line = h("div", "nbc-ghead nbc-small");
        line.dataset.action = "toggle-traceback";
        line.dataset.key = key;
        line.append(h("span", "nbc-caret", ui.tracebacks.has(key) ? "▾" : "▸"),
          h("span", "nbc-code", f.thread_name),
          h("span", "nbc-muted", isNum(f.cell) ? `cell [${f.cell}]` : ""),
          h("span", "nbc-why nbc-line", `${f.exc_type}: ${f.message}`));
        const parts = [line];
        if (ui.tracebacks.has(key)) {
          const pre = h("div", "nbc-pre");
          pre.textContent = safe(f.traceback, true);
          parts.push(pre);
        }
        node.replaceChildren(...parts);
      });
  }
  return { els: [failureSec], draw: drawFailures };
}
