// @ts-check
/**
 * The panel's sections, registered in one place: each is one draw module under sections/ and the traits of
 * nbcoord.ui.widget.NBCoordPanel it shows. The view draws them in this order, and redraws a section only when
 * one of its traits changed (or the view marks it: a click, a filter, the ticker).
 *
 * A new section: its module under sections/ (``(v: View) => Section``) and one line here. ``top`` sections sit
 * above the body (the header and the status line), the others in the body, in this order.
 */

import { failuresSection } from "./sections/failures.js";
import { headSection } from "./sections/head.js";
import { lastStopSection } from "./sections/last-stop.js";
import { memorySection } from "./sections/memory.js";
import { outcomeSection } from "./sections/outcome.js";
import { queuesSection } from "./sections/queues.js";
import { sessionsSection } from "./sections/sessions.js";
import { statusSection } from "./sections/status.js";
import { threadsSection } from "./sections/threads.js";

/**
 * @typedef {{
 *   name: string, make: (v: import("./view.js").View) => import("./view.js").Section, traits: string[],
 *   top?: boolean,
 * }} SectionEntry
 */

/** @type {SectionEntry[]} */
export const SECTIONS = [
  { name: "head", make: headSection, top: true, traits: ["header", "resources", "last_stop", "outcome", "clock"] },
  { name: "status", make: statusSection, top: true, traits: ["header", "clock", "beat", "ack"] },
  {
    name: "threads", make: threadsSection,
    traits: ["header", "threads", "ledger", "groups", "cells", "cell_memory", "last_stop", "stack", "clock"],
  },
  { name: "sessions", make: sessionsSection, traits: ["sessions", "outcome", "clock"] },
  { name: "queues", make: queuesSection, traits: ["queues", "blocked", "history", "clock"] },
  { name: "memory", make: memorySection, traits: ["cells", "cell_memory", "resources", "history"] },
  { name: "failures", make: failuresSection, traits: ["failures"] },
  { name: "last", make: lastStopSection, traits: ["last_stop", "clock"] },
  { name: "outcome", make: outcomeSection, traits: ["outcome", "clock"] },
];

/** Traits the view follows that no section draws: the fast route's kind (read when a command is sent). */
const UNDRAWN_TRAITS = ["_fast_route"];

/** @type {Record<string, string[]>} the sections each trait is drawn in */
export const SECTIONS_OF = {};
for (const section of SECTIONS) {
  for (const trait of section.traits) (SECTIONS_OF[trait] ||= []).push(section.name);
}
for (const trait of UNDRAWN_TRAITS) SECTIONS_OF[trait] ||= [];

/** Every trait the view listens to. */
export const TRAITS = Object.keys(SECTIONS_OF);
