// @ts-check
/**
 * The panel's ways to the kernel and the page: commands (on the fast route too), the page's kernel connection,
 * the view's id, and the URL of nbcoord's server page.
 */

/**
 * The Jupyter server's base URL, from the page's Jupyter config (JupyterLab, Notebook 7), ending in "/"; null
 * where there is none (VS Code).
 * @returns {string | null}
 */
export function baseUrl() {
  const node = document.getElementById("jupyter-config-data");
  if (!node) return null;
  try {
    const base = JSON.parse(node.textContent || "{}").baseUrl;
    return typeof base === "string" ? base.replace(/\/?$/, "/") : null;
  } catch (err) {
    return null;
  }
}

/**
 * The URL of nbcoord's server page (every kernel of this Jupyter server); null where the page has no Jupyter
 * config (VS Code).
 * @returns {string | null}
 */
export function fleetUrl() {
  const base = baseUrl();
  return base === null ? null : `${base}nbcoord/`;
}

/**
 * Send a command so that it is handled while a cell is busy.
 *
 * The ordinary ``model.send`` always goes (any front end; handled when the main thread is free). When the
 * kernel's fast route is "control" (ipykernel 6), the same command also goes as a comm_msg on the control
 * channel, which ipykernel 6 reads off the main thread. On "shell-channel" (ipykernel 7) the kernel copies the
 * ordinary message itself. The kernel acts on the first copy and drops the other by its click id.
 * @param {any} model
 * @param {Record<string, unknown>} content
 */
export function sendCommand(model, content) {
  /** @type {{kind?: string, comm_id?: string} | null} */
  const route = model.get("_fast_route");
  if (route && route.kind === "control" && typeof route.comm_id === "string") {
    sendOnControl(model, route.comm_id, content);
  }
  model.send(content);
}

/**
 * @param {any} model
 * @param {string} commId
 * @param {Record<string, unknown>} content
 * @returns {boolean} whether the control-channel message was sent
 */
function sendOnControl(model, commId, content) {
  // The @jupyterlab/services kernel connection (JupyterLab 4, Notebook 7); other front ends (VS Code, Colab)
  // may not expose it: the ordinary message then does the job, late.
  const kernel = model.widget_manager && model.widget_manager.kernel;
  if (!kernel || typeof kernel.sendControlMessage !== "function") return false;
  const msgId = globalThis.crypto && typeof crypto.randomUUID === "function"
    ? crypto.randomUUID()
    : `nbcoord-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
  const msg = {
    channel: "control",
    header: {
      msg_id: msgId,
      msg_type: "comm_msg",
      username: kernel.username || "",
      session: kernel.clientId || "",
      date: new Date().toISOString(),
      version: "5.3",
    },
    parent_header: {},
    metadata: {},
    content: { comm_id: commId, data: { method: "custom", content } },
    buffers: [],
  };
  try {
    // expectReply=false: comm_msg has no reply; the future ends on the kernel's idle status.
    const future = kernel.sendControlMessage(msg, false, true);
    if (future && future.done) future.done.catch(() => {});
    return true;
  } catch (err) {
    console.warn("nbcoord: control-channel send failed", err);
    return false;
  }
}

/** A per-view random id: commands carry `${viewId}-${n}` as their click id. */
export function newViewId() {
  return `v${Math.random().toString(36).slice(2, 10)}${Date.now().toString(36)}`;
}

/** The kernel connection of the page (JupyterLab, Notebook 7), if the widget manager exposes it. @param {any} model */
export function kernelOf(model) {
  try {
    const kernel = model.widget_manager && model.widget_manager.kernel;
    return kernel && typeof kernel === "object" ? kernel : null;
  } catch (err) {
    return null;
  }
}
