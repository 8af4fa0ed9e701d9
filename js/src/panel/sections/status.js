// @ts-check
import { duration, h, isNum, plural } from "../../shared/text.js";
import { setText } from "../dom.js";
import { kernelOf } from "../kernel.js";
import { ACK_MS } from "../view.js";
import { clockTime } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */

/**
 * The status line and the banner (busy in a C call, beats that stopped, a kernel gone).
 * @param {View} v
 * @returns {Section}
 */
export function statusSection(v) {
  const { ui, get, model, kernelNow } = v;
  const status = h("div", "nbc-status nbc-small nbc-muted");
  const banner = h("div", "nbc-banner");
  banner.setAttribute("role", "status");
  banner.hidden = true;
  function drawStatus() {
    const header = get("header") || {};
    const now = kernelNow();
    const parts = [];
    const kernel = kernelOf(model);
    const pageBusy = kernel && kernel.status === "busy";
    if (ui.stale) {
      parts.push(`kernel gone at ${clockTime(ui.stale.at)}`);
    } else if (isNum(header.running_cell)) {
      const since = isNum(header.running_since) ? ` for ${duration(now - header.running_since)}` : "";
      parts.push(`cell [${header.running_cell}] running${since}`);
    } else if (pageBusy) {
      parts.push(`kernel busy${ui.busySince ? ` since ${clockTime(ui.busySince)}` : ""}`);
    } else if (header.pid !== undefined) {
      parts.push("kernel idle");
    }
    if (isNum(header.kernel_threads)) parts.push(`${plural(header.kernel_threads, "kernel thread")} not shown`);
    if (isNum(header.native_threads)) parts.push(plural(header.native_threads, "native thread"));
    if (header.route === "none") parts.push("no fast route: Stop acts when the running cell ends");
    setText(status, parts.join(" · "));
    drawBanner(header, now, pageBusy);
  }

  /** @param {any} header @param {number} now @param {boolean} pageBusy */
  function drawBanner(header, now, pageBusy) {
    let text = "";
    if (ui.stale) {
      text = `The kernel of this panel is gone (${ui.stale.why}). What it shows is from ${clockTime(ui.stale.at)}; `
        + "its buttons are off. Run %nbcoord panel in the new kernel for a live panel.";
    } else {
      const beat = get("beat");
      const every = beat && isNum(beat.every) ? beat.every : isNum(header.interval) ? header.interval : 1;
      const limit = 3 * every * 1000 + 1000;
      const silent = performance.now() - ui.lastUpdate;
      const unanswered = [...ui.pending.values()].filter((p) => !p.acked && performance.now() - p.at > ACK_MS);
      const running = isNum(header.running_cell) || pageBusy;
      if (unanswered.length && header.route !== "none") {
        const beatAt = beat && isNum(beat.at) ? beat.at : 0;
        const since = Math.max(ui.lastHeard, beatAt, ui.busySince || 0, isNum(header.running_since) ? header.running_since : 0);
        text = `Kernel busy in a C call since ${clockTime(since)} (${duration(now - since)}): it holds the GIL, so `
          + "your click waits; the stop will act when the call returns.";
      } else if (silent > limit && isNum(header.running_cell)) {
        text = `Kernel busy in native code (no update for ${duration(silent / 1000)}); stop will act when it returns.`;
      } else if (unanswered.length && header.route === "none" && running) {
        const cell = isNum(header.running_cell) ? `cell [${header.running_cell}]` : "the running cell";
        text = `Stop will act when ${cell} ends (no fast route for this kernel).`;
      }
    }
    if (banner.hidden !== !text) banner.hidden = !text;
    setText(banner, text);
  }
  return { els: [status, banner], draw: drawStatus };
}
