// @ts-check
import { duration, h, isNum, safe } from "../../shared/text.js";
import { setClass, setText } from "../dom.js";
import { clockTime } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */

/**
 * The last restart of a session's runners, or the last reclaim of memory.
 * @param {View} v
 * @returns {Section}
 */
export function outcomeSection(v) {
  const { get, kernelNow } = v;
  const outcomeSec = h("div", "nbc-sec");
  outcomeSec.dataset.section = "outcome";
  const outcomeTitle = h("div", "nbc-sec-title");
  const outcomeLabel = h("span", "");
  const outcomeAgo = h("span", "nbc-muted nbc-small");
  outcomeTitle.append(outcomeLabel, outcomeAgo);
  const outcomeText = h("div", "nbc-pre");
  outcomeSec.append(outcomeTitle, outcomeText);

  function drawOutcome() {
    const outcome = get("outcome");
    outcomeSec.hidden = !outcome;
    if (!outcome) return;
    // A stop click appears here only when it was refused (too many different stops waited); its report is below.
    const what = outcome.kind === "restart" ? `Last restart (session ${safe(outcome.session || "?")})`
      : outcome.kind === "stop" ? "Last stop click" : "Last reclaim";
    setText(outcomeLabel, `${what}${outcome.refused ? ": refused" : outcome.ok === false ? ": failed" : ""}`);
    if (isNum(outcome.started_at)) {
      outcomeAgo.dataset.ago = String(outcome.started_at);
      setText(outcomeAgo, `${duration(kernelNow() - outcome.started_at)} ago, at ${clockTime(outcome.started_at)}`);
    }
    const text = safe(outcome.text || (outcome.errors || []).join("\n"), true);
    if (outcomeText.textContent !== text) outcomeText.textContent = text;
    setClass(outcomeText, `nbc-pre${outcome.ok === false ? " nbc-why" : ""}`);
  }
  return { els: [outcomeSec], draw: drawOutcome };
}
