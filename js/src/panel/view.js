// @ts-check
/**
 * The contract between the view (render.js) and its sections (sections/*.js): what a section receives and what
 * it gives back. A section module exports one function ``(v: View) => Section``; sections.js registers it.
 */

/** A click not acknowledged this long after it was sent was not handled: the banner says why. */
export const ACK_MS = 600;

/**
 * What a section sees of its view: the model, the per-view UI state and the view's actions.
 * @typedef {{
 *   model: any, ui: any, get: (name: string) => any, kernelNow: () => number, frozenNow: () => number,
 *   send: (command: Record<string, unknown>) => string | null, mark: (...sections: string[]) => void,
 *   button: (node: HTMLButtonElement, key: string, idle: string, busy: string) => void,
 * }} View
 */

/**
 * A part of the panel: its elements, the function that brings them up to date, and what undoes its listeners.
 * @typedef {{ els: HTMLElement[], draw: () => void, dispose?: () => void }} Section
 */
