// @ts-check
import { duration, h, isNum, plural } from "../../shared/text.js";
import { setText } from "../dom.js";
import { kernelOf } from "../kernel.js";
import { canActOutside, kernelAction, outsideOf, readStacks } from "../outside.js";
import { ASK_MS, moment, quietOf } from "../quiet.js";
import { clockTime } from "../words.js";

/** @typedef {import("../view.js").View} View */
/** @typedef {import("../view.js").Section} Section */
/** @typedef {import("../quiet.js").Quiet} Quiet */
/** @typedef {import("../outside.js").StacksRead} StacksRead */
/** @typedef {import("../outside.js").MainThread} MainThread */

/** After Interrupt, the stacks are read again this much later: is the main thread still where it was? */
export const VERIFY_MS = 1500;
/** Restart asks for a second click within this long. */
export const CONFIRM_MS = 5000;

export const INTERRUPT_WHY = "Interrupt sends SIGINT: ends Python code, not a C call that never checks signals.";
export const RESTART_WHY = "Restart ends the kernel and everything in it; variables are lost.";
export const NATIVE_WHY = "Reads the main thread's C frames too; pauses the kernel about 0.2 s.";
/** How many of the main thread's native frames are shown, innermost first. */
const NATIVE_SHOWN = 8;

/**
 * The status line and the banner (busy in a C call, a kernel that does not answer, a kernel gone). While the kernel
 * does not answer, the server is asked for its stacks (at most once per ASK_MS) and the banner offers Interrupt
 * and Restart.
 * @param {View} v
 * @returns {Section}
 */
export function statusSection(v) {
  const { ui, get, model, kernelNow, mark } = v;
  const status = h("div", "nbc-status nbc-small nbc-muted");
  const banner = h("div", "nbc-banner");
  banner.setAttribute("role", "status");
  banner.hidden = true;
  const bannerText = h("div", "nbc-banner-text");
  const interrupt = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn", "Interrupt"));
  const restart = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn danger", "Restart"));
  interrupt.dataset.way = "interrupt";
  restart.dataset.way = "restart";
  const nativeButton = /** @type {HTMLButtonElement} */ (h("button", "nbc-btn", "Native frames"));
  nativeButton.dataset.way = "native";
  const nativeLine = h("div", "nbc-native nbc-small");
  const verdict = h("div", "nbc-verdict");
  const ways = h("div", "nbc-ways");
  /** @type {Array<[HTMLButtonElement, string]>} */
  const offers = [[interrupt, INTERRUPT_WHY], [restart, RESTART_WHY], [nativeButton, NATIVE_WHY]];
  for (const [button, why] of offers) {
    const line = h("div", "nbc-way");
    line.append(button, h("span", "nbc-small", why));
    ways.append(line);
  }
  banner.append(bannerText, nativeLine, ways, verdict);

  /** The reads of the kernel's stacks from outside, this view's. */
  const asker = {
    /** @type {Promise<void> | null} */ inFlight: null,
    lastAskAt: -Infinity,
    /** @type {(StacksRead & {askedAt: number}) | null} the last read, while the kernel has said nothing since */
    read: null,
    /** no server to ask (VS Code, or a server without the endpoint) */
    missing: false,
  };
  /** The ways out: Interrupt's check and Restart's confirmation. */
  const way = {
    /** @type {number | null} */ interruptAt: null,
    /** @type {MainThread | null} where the main thread was when Interrupt was clicked */
    before: null,
    verdict: "",
    /** @type {number | null} */ armedAt: null,
    restarting: false,
    /** the main thread's native frames as last read on a click ("" none), and whether a read runs */
    native: "",
    readingNative: false,
  };
  /** @type {Set<ReturnType<typeof setTimeout>>} */
  const timers = new Set();
  /** @type {number | null} when the wake timer fires (performance.now()) */
  let wakeAt = null;

  /** @param {number} ms @param {() => void} fn */
  function later(ms, fn) {
    const timer = setTimeout(() => {
      timers.delete(timer);
      fn();
    }, Math.max(0, ms));
    timers.add(timer);
  }

  /** Redraw the status in ``ms``, unless an earlier wake is due. @param {number} ms */
  function wake(ms) {
    const at = performance.now() + ms;
    if (wakeAt !== null && wakeAt <= at) return;
    wakeAt = at;
    later(ms, () => {
      wakeAt = null;
      mark("status");
    });
  }

  /**
   * Read the stacks from outside; the answer is dropped if the kernel spoke meanwhile.
   * @param {boolean} [force] ignore the rate (Interrupt's check)
   * @returns {Promise<void>}
   */
  function ask(force = false) {
    const { id, base } = outsideOf(model);
    if (asker.missing || !id || base === null || ui.stale) return Promise.resolve();
    if (asker.inFlight) return force ? asker.inFlight.then(() => ask(true)) : asker.inFlight;
    if (!force && performance.now() - asker.lastAskAt < ASK_MS) return Promise.resolve();
    const askedAt = performance.now();
    asker.lastAskAt = askedAt;
    asker.inFlight = readStacks(base, id).then((read) => {
      asker.inFlight = null;
      if (read.kind === "missing") asker.missing = true;
      else if (ui.lastUpdate < askedAt) asker.read = { ...read, askedAt };
      mark("status");
    });
    return asker.inFlight;
  }

  /** The read of this quiet spell, if any: none once the kernel has spoken since it was asked. */
  function currentRead() {
    if (asker.read && ui.lastUpdate >= asker.read.askedAt) asker.read = null;
    return asker.read;
  }

  function drawStatus() {
    const header = get("header") || {};
    const now = kernelNow();
    const kernel = kernelOf(model);
    const pageBusy = Boolean(kernel && kernel.status === "busy");
    const quiet = quietOf(ui, header, get("beat"), pageBusy, performance.now());
    if (!ui.stale && quiet.ask) ask();
    if (!ui.stale && quiet.expecting) {
      // The moments the view's judgement changes: the server may be asked, the beats' limit passes.
      const next = [quiet.ask ? Infinity : quiet.askInMs, quiet.notAnswering ? Infinity : quiet.limitMs - quiet.silentMs];
      if (Math.min(...next) < Infinity) wake(Math.min(...next) + 5);
    }
    if (!quiet.ask && !quiet.notAnswering) resetWay();
    const read = quiet.ask || quiet.notAnswering ? currentRead() : null;
    const main = read && read.kind === "answer" && read.available ? read.main : null;
    const parts = [];
    if (ui.stale) {
      parts.push(`kernel gone at ${clockTime(ui.stale.at)}`);
    } else if (main) {
      parts.push(outsideStatus(main, now, quiet));
    } else if (quiet.notAnswering) {
      const cell = isNum(header.running_cell) ? `cell [${header.running_cell}] running${runningFor(header, now)}, ` : "";
      parts.push(`${cell}kernel not answering for ${moment(quiet.silentMs / 1000)}`);
    } else if (isNum(header.running_cell)) {
      parts.push(`cell [${header.running_cell}] running${runningFor(header, now)}`);
    } else if (pageBusy || (ui.executes && ui.executes.size)) {
      parts.push(`kernel busy${ui.busySince ? ` since ${clockTime(ui.busySince)}` : ""}`);
    } else if (header.pid !== undefined) {
      parts.push("kernel idle");
    }
    if (isNum(header.kernel_threads)) parts.push(`${plural(header.kernel_threads, "kernel thread")} not shown`);
    if (isNum(header.native_threads)) parts.push(plural(header.native_threads, "native thread"));
    if (header.route === "none") parts.push("no fast route: Stop acts when the running cell ends");
    setText(status, parts.join(" · "));
    drawBanner(header, now, quiet, read, main, pageBusy);
  }

  /**
   * @param {any} header @param {number} now @param {Quiet} quiet @param {StacksRead | null} read
   * @param {MainThread | null} main @param {boolean} pageBusy
   */
  function drawBanner(header, now, quiet, read, main, pageBusy) {
    let text = "";
    const fast = header.route !== "none";
    const waits = quiet.unanswered && fast ? " Your click waits: the stop will act when the call returns." : "";
    if (ui.stale) {
      text = `The kernel of this panel is gone (${ui.stale.why}). What it shows is from ${clockTime(ui.stale.at)}; `
        + "its buttons are off. Run %nbcoord panel in the new kernel for a live panel.";
    } else if (main && (quiet.notAnswering || quiet.ask)) {
      text = `Kernel ${main.doing} (read from outside at ${clockTime(read && read.kind === "answer" ? read.readAt : now)}).${waits}`;
    } else if (quiet.notAnswering) {
      const since = now - quiet.silentMs / 1000;
      const silence = `not answering since ${clockTime(since)} (${moment(quiet.silentMs / 1000)})`;
      text = quiet.unanswered && fast
        ? `Kernel busy in a C call, ${silence}: it holds the GIL, so your click waits; the stop will act when the call returns.`
        : `Kernel busy in native code, ${silence}; the stop will act when it returns.`;
      if (read && read.kind === "answer" && !read.available && read.reason) text += ` No stacks from outside: ${read.reason}`;
    } else if (quiet.late && !fast && (isNum(header.running_cell) || pageBusy)) {
      const cell = isNum(header.running_cell) ? `cell [${header.running_cell}]` : "the running cell";
      text = `Stop will act when ${cell} ends (no fast route for this kernel).`;
    }
    const offer = !ui.stale && Boolean(text) && (quiet.notAnswering || Boolean(main)) && canActOutside(model);
    if (offer && way.interruptAt === null) way.before = main;
    if (banner.hidden !== !text) banner.hidden = !text;
    setText(bannerText, text);
    if (ways.hidden !== !offer) ways.hidden = !offer;
    const armed = way.armedAt !== null && performance.now() - way.armedAt < CONFIRM_MS;
    setText(interrupt, way.interruptAt !== null && !way.verdict ? "Interrupting…" : "Interrupt");
    setText(restart, way.restarting ? "Restarting…" : armed ? "Click again to restart" : "Restart");
    restart.classList.toggle("armed", armed);
    setText(verdict, offer ? way.verdict : "");
    verdict.hidden = !offer || !way.verdict;
    const withNative = offer && outsideOf(model).base !== null && !asker.missing;
    const nativeWay = /** @type {HTMLElement} */ (nativeButton.parentElement);
    if (nativeWay.hidden !== !withNative) nativeWay.hidden = !withNative;
    setText(nativeButton, way.readingNative ? "Reading…" : "Native frames");
    setText(nativeLine, withNative ? way.native : "");
    nativeLine.hidden = !withNative || !way.native;
  }

  /** The kernel answers again: the ways out start over. */
  function resetWay() {
    way.interruptAt = null;
    way.before = null;
    way.verdict = "";
    way.armedAt = null;
    way.native = "";
  }

  /** The user asked for the main thread's native frames: read once, with ``?native=1``. */
  function onNative() {
    const { id, base } = outsideOf(model);
    if (way.readingNative || !id || base === null) return;
    way.readingNative = true;
    mark("status");
    readStacks(base, id, { native: true }).then((read) => {
      way.readingNative = false;
      if (read.kind !== "answer") way.native = read.kind === "failed" ? `Native frames not read: ${read.why}` : "";
      else if (!read.available) way.native = `Native frames not read: ${read.reason || "the server cannot read them"}`;
      else if (!read.native.length) way.native = "No native frames were read for the main thread.";
      else {
        const frames = read.native.slice(-NATIVE_SHOWN).reverse()
          .map((f) => (f.library ? `${f.symbol} (${f.library})` : f.symbol));
        way.native = `Main thread, native, innermost first: ${frames.join(" ← ")}`;
      }
      mark("status");
    });
  }

  function onInterrupt() {
    if (way.interruptAt !== null && !way.verdict) return;
    const at = performance.now();
    way.interruptAt = at;
    way.verdict = "";
    const before = way.before;
    kernelAction(model, "interrupt").then(
      () => later(VERIFY_MS, () => void check(at, before)),
      (err) => {
        way.verdict = `Interrupt failed: ${err instanceof Error ? err.message : String(err)}`;
        mark("status");
      },
    );
    mark("status");
  }

  /**
   * After Interrupt: the kernel answered (the banner goes), or the main thread is where it was.
   * @param {number} at when Interrupt was clicked @param {MainThread | null} before
   */
  async function check(at, before) {
    if (way.interruptAt !== at || ui.lastUpdate > at) return;
    await ask(true);
    if (way.interruptAt !== at || ui.lastUpdate > at) return;
    const read = currentRead();
    const main = read && read.kind === "answer" && read.available ? read.main : null;
    if (main && before && main.since === before.since && main.tid === before.tid && (main.in_c || main.holds_gil)) {
      way.verdict = "Interrupt cannot end this call; Restart will.";
    } else if (main && before) {
      way.verdict = `Interrupted; the main thread moved on: ${main.doing}.`;
    } else {
      way.verdict = `No answer ${moment(VERIFY_MS / 1000)} after Interrupt: the call may not check signals; Restart will end it.`;
    }
    mark("status");
  }

  function onRestart() {
    if (way.restarting) return;
    const now = performance.now();
    if (way.armedAt === null || now - way.armedAt >= CONFIRM_MS) {
      way.armedAt = now;
      later(CONFIRM_MS + 5, () => mark("status"));
      mark("status");
      return;
    }
    way.armedAt = null;
    way.restarting = true;
    kernelAction(model, "restart").then(
      () => {
        way.restarting = false;
        mark("status");
      },
      (err) => {
        way.restarting = false;
        way.verdict = `Restart failed: ${err instanceof Error ? err.message : String(err)}`;
        mark("status");
      },
    );
    mark("status");
  }

  /** @param {Event} event */
  function onClick(event) {
    const target = event.target instanceof Element ? event.target.closest("[data-way]") : null;
    if (!target || ui.stale) return;
    event.stopPropagation();
    const which = /** @type {HTMLElement} */ (target).dataset.way;
    if (which === "interrupt") onInterrupt();
    else if (which === "restart") onRestart();
    else onNative();
  }
  ways.addEventListener("click", onClick);

  return {
    els: [status, banner],
    draw: drawStatus,
    dispose: () => {
      ways.removeEventListener("click", onClick);
      for (const timer of timers) clearTimeout(timer);
    },
  };
}

/** " for 5 s" since the running cell began, as the kernel said. @param {any} header @param {number} now */
function runningFor(header, now) {
  return isNum(header.running_since) ? ` for ${duration(now - header.running_since)}` : "";
}

/**
 * The status line from a read from outside: "cell [3] running for 4.1 s (read from outside)".
 * @param {MainThread} main @param {number} now @param {Quiet} quiet
 */
function outsideStatus(main, now, quiet) {
  const figure = isNum(main.since)
    ? ` for ${main.since_exact ? "" : "at least "}${moment(now - main.since)}`
    : ` (not answering for ${moment(quiet.silentMs / 1000)})`;
  const what = isNum(main.cell) ? `cell [${main.cell}] running` : "kernel busy";
  return `${what}${figure} (read from outside)`;
}
