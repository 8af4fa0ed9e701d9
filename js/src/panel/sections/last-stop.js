// @ts-check
import { duration, h, isNum, plural } from "../../shared/text.js";
import { setText } from "../dom.js";
import { clockTime } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */

const MAX_ALIVE_SHOWN = 20;

/**
 * The last stop: true counts, what is still alive, whether the running cell was interrupted.
 * @param {View} v
 * @returns {Section}
 */
export function lastStopSection(v) {
  const { ui, get, kernelNow, button } = v;
  const lastSec = h("div", "nbc-sec");
  lastSec.dataset.section = "last-stop";
  const lastTitle = h("div", "nbc-sec-title");
  const lastLabel = h("span", "");
  const lastAgo = h("span", "nbc-muted nbc-small");
  lastTitle.append(lastLabel, lastAgo);
  const lastBody = h("div", "");
  lastSec.append(lastTitle, lastBody);

  function drawLastStop() {
    const last = get("last_stop");
    lastSec.hidden = !last;
    if (!last) return;
    const scope = last.scope === "cell" ? `cell [${last.cell}]` : last.scope;
    setText(lastLabel, `Last stop (${scope}${last.interrupt ? ", and the running cell" : ""})`);
    if (isNum(last.started_at)) {
      lastAgo.dataset.ago = String(last.started_at);
      setText(lastAgo, `${duration(kernelNow() - last.started_at)} ago, at ${clockTime(last.started_at)}`);
    }
    const alive = last.alive || [];
    const aliveCount = isNum(last.alive_count) ? last.alive_count : alive.length;
    const stoppedCount = isNum(last.stopped_count) ? last.stopped_count : (last.stopped || []).length;
    const summary = h("div", "nbc-small");
    summary.append(h("span", `nbc-chip ${aliveCount ? "err" : "ok"}`, `${stoppedCount} stopped, ${aliveCount} still alive`),
      h("span", "nbc-muted", ` in ${Math.round((last.took_s || 0) * 1000)} ms`));
    if (last.route) {
      const via = last.route === "ordinary" ? "the widget message" : `the ${last.route} route`;
      summary.append(h("span", "nbc-muted", ` · via ${via}`));
    }
    if (isNum(last.clicked_at) && isNum(last.received_at)) {
      // Both clocks in kernel time: the click's moment corrected by this view's clock offset.
      const latency = Math.max(0, Math.round(last.received_at * 1000 - (last.clicked_at + ui.offsetMs)));
      const handled = h("span", "nbc-muted", ` · handled ${latency} ms after the click`);
      handled.dataset.latency = String(latency);
      summary.append(handled);
    }
    const parts = [summary];
    const interrupt = last.interrupt;
    if (interrupt && isNum(interrupt.cell)) {
      parts.push(h("div", "nbc-small", interrupt.sent
        ? `Interrupted cell [${interrupt.cell}], which was still running.`
        : `Cell [${interrupt.cell}] was not interrupted: ${interrupt.why}.`));
    }
    if (isNum(last.items_stopped) && last.items_stopped) parts.push(h("div", "nbc-small", `${plural(last.items_stopped, "task")} stopped too.`));
    if (alive.length) {
      const list = h("div", "nbc-scroll short");
      list.dataset.scroll = "alive";
      const shown = ui.showAllAlive ? alive : alive.slice(0, MAX_ALIVE_SHOWN);
      for (const a of shown) list.appendChild(h("div", "nbc-small nbc-kids nbc-why", `${a.name} (${a.tid}): ${a.reason}`));
      parts.push(list);
      if (shown.length < aliveCount) {
        const more = h("div", "nbc-more nbc-small nbc-muted");
        more.append(h("span", "", `Showing ${shown.length} of ${aliveCount} still alive.`));
        if (shown.length < alive.length) {
          const all = h("button", "nbc-link", `Show ${alive.length}`);
          all.dataset.action = "expand-alive";
          more.append(all);
        }
        parts.push(more);
      }
    }
    for (const i of last.items_alive || []) {
      parts.push(h("div", "nbc-small nbc-kids nbc-why", `${i.label} (${i.id}): ${i.reason || "still running"}`));
    }
    for (const e of last.stopper_errors || []) {
      parts.push(h("div", "nbc-small nbc-kids nbc-why", `stopper ${e.stopper} failed: ${e.error}`));
    }
    if (aliveCount && !last.force) {
      const force = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn"));
      force.dataset.action = "force";
      force.title = "Raise ThreadStopped in the threads still running Python code";
      button(force, "force", "force stop", "forcing…");
      parts.push(force);
    }
    const scrollBox = lastBody.querySelector("[data-scroll]");
    const top = scrollBox ? scrollBox.scrollTop : 0;
    lastBody.replaceChildren(...parts);
    const box = lastBody.querySelector("[data-scroll]");
    if (box && top) box.scrollTop = top;
  }
  return { els: [lastSec], draw: drawLastStop };
}
