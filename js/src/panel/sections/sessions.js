// @ts-check
import { h, isNum, plural, safe } from "../../shared/text.js";
import { push, reconcile } from "../dom.js";
import { sinceText } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */
/** @typedef {import("../dom.js").Keyed} Keyed */

const MAX_RUNNERS_SHOWN = 10;

/**
 * TensorFlow sessions: stuck runners as sentences, the working ones per queue, a restart.
 * @param {View} v
 * @returns {Section}
 */
export function sessionsSection(v) {
  const { ui, get, kernelNow, button } = v;
  const sessionSec = h("div", "nbc-sec");
  sessionSec.dataset.section = "sessions";
  const sessionList = h("div", "");
  sessionSec.append(h("div", "nbc-sec-title", "TensorFlow sessions"), sessionList);
  /** @type {Map<string, Keyed>} */
  const sessionNodes = new Map();

  function drawSessions() {
    const sessions = get("sessions") || [];
    sessionSec.hidden = !sessions.length;
    const now = kernelNow();
    reconcile(sessionList, sessionNodes, sessions, (x) => String(x.id),
      (x) => `${JSON.stringify(x)}|${ui.pending.has(`restart:${x.id}`)}|${ui.stale ? 1 : 0}`,
      () => /** @type {Keyed} */ (h("div", "nbc-sess")), (node, x) => updateSession(node, x, now));
  }

  /** @param {Keyed} node @param {any} x @param {number} now */
  function updateSession(node, x, now) {
    const line = h("div", "nbc-ghead");
    const where = isNum(x.cell) ? ` · cell [${x.cell}]` : "";
    line.append(h("span", "nbc-code", `session ${x.id}`), h("span", "nbc-muted nbc-small",
      `${x.target ? `${x.target} · ` : ""}${plural(x.runner_threads || 0, "runner thread")}${where}${x.closed ? " · closed" : ""}`));
    if (x.stuck_runners) line.append(h("span", "nbc-chip err", `${x.stuck_runners} stuck`));
    line.append(h("span", "nbc-spacer"));
    if (x.restartable) {
      const restart = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn"));
      restart.dataset.action = "restart";
      restart.dataset.session = String(x.id);
      restart.title = "Stop this session's queue runners, reset the queues that closed, and start the runners again";
      button(restart, `restart:${x.id}`, "Restart runners", "Restarting…");
      line.append(restart);
    }
    const kids = [line];
    const runners = x.runners || [];
    const stuck = runners.filter((/** @type {any} */ r) => r.stuck);
    for (const r of stuck.slice(0, MAX_RUNNERS_SHOWN)) {
      const sentence = h("div", "nbc-small nbc-kids nbc-why nbc-sentence", sinceText(r, now));
      sentence.title = safe(r.name);
      if (isNum(r.since) && typeof r.text === "string" && r.text.includes("{duration}")) {
        sentence.dataset.blocked = JSON.stringify([r.text, r.since]);
      }
      kids.push(sentence);
    }
    if (stuck.length > MAX_RUNNERS_SHOWN) {
      kids.push(h("div", "nbc-small nbc-kids nbc-muted", `… and ${stuck.length - MAX_RUNNERS_SHOWN} more stuck runner threads`));
    }
    // The runners that work, per queue: a count and their names on hover.
    /** @type {Map<string, any[]>} */
    const byQueue = new Map();
    for (const r of runners) if (!r.stuck) push(byQueue, String(r.queue_name ?? "?"), r);
    for (const [queue, list] of byQueue) {
      const line = h("div", "nbc-small nbc-kids nbc-muted nbc-line", `queue ${queue}: ${plural(list.length, "runner thread")} working`);
      line.title = safe(list.map((/** @type {any} */ r) => `${r.name}${r.role ? ` (${r.role})` : ""}`).join("\n"), true);
      kids.push(line);
    }
    node.replaceChildren(...kids);
  }
  return { els: [sessionSec], draw: drawSessions };
}
