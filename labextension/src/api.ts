/**
 * nbcoord's server API, as this extension reads it: `GET {baseUrl}nbcoord/api/kernels` (the schema is
 * nbcoord/server/_model.py; only the fields used here are typed) and `POST {baseUrl}nbcoord/api/kernels/<id>/stop`.
 *
 * Requests go through `ServerConnection.makeRequest`, so the server's own token, cookies and XSRF header apply:
 * nothing here is security.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** A kernel's own summary (nbcoord.core.schema.KernelSummary), the fields shown here. */
export interface IKernelSummary {
  threads: number;
  threads_by_state: Record<string, number>;
  zombies: number;
  running_cell: number | null;
}

/** One row of the view (nbcoord.server._model.KernelRow), the fields shown here. */
export interface IKernelRow {
  id: string;
  path: string | null;
  execution_state: string | null;
  status: 'ok' | 'no-nbcoord' | 'not-answering' | 'dead' | 'error';
  error: string | null;
  gpu: { index: number; bytes: number; workers_bytes: number }[];
  nbcoord: IKernelSummary | null;
}

export interface IFleetView {
  schema: number;
  taken_at: number;
  kernels: IKernelRow[];
}

export type StopScope = 'all' | 'zombies';

/** The server page, optionally showing one kernel: `{baseUrl}nbcoord/[?kernel=<id>]`. */
export function pageUrl(settings: ServerConnection.ISettings, kernelId?: string): string {
  const url = URLExt.join(settings.baseUrl, 'nbcoord/');
  return kernelId ? `${url}?kernel=${encodeURIComponent(kernelId)}` : url;
}

/** The server's JSON error sentence (`{"message": ...}`), else its status. */
async function failure(response: Response): Promise<Error> {
  let message = `the server answered ${response.status}`;
  try {
    const body = await response.json();
    if (body && typeof body.message === 'string' && body.message) {
      message = body.message;
    }
  } catch {
    // not JSON: the status says it
  }
  return new Error(message);
}

export async function fetchKernels(settings: ServerConnection.ISettings, fresh = false): Promise<IFleetView> {
  // A periodic poll lets the server answer with a view it collected less than 1 s ago (for another page: open pages
  // share it); a refresh because something changed (`fresh`) asks for one collected now.
  const url = URLExt.join(settings.baseUrl, 'nbcoord/api/kernels') + (fresh ? '' : '?recent=1');
  const response = await ServerConnection.makeRequest(url, { method: 'GET' }, settings);
  if (!response.ok) {
    throw await failure(response);
  }
  const view = (await response.json()) as IFleetView;
  if (!view || !Array.isArray(view.kernels)) {
    throw new Error('the server sent no kernels');
  }
  return view;
}

/** That kernel's one bounded stop; resolves to the number of threads it stopped and of those still alive. */
export async function stopKernel(
  settings: ServerConnection.ISettings,
  kernelId: string,
  scope: StopScope
): Promise<{ stopped: number; alive: number }> {
  const url = URLExt.join(settings.baseUrl, 'nbcoord/api/kernels', encodeURIComponent(kernelId), 'stop');
  const response = await ServerConnection.makeRequest(
    url,
    { method: 'POST', body: JSON.stringify({ scope }) },
    settings
  );
  if (!response.ok) {
    throw await failure(response);
  }
  const body = await response.json();
  const report = body && body.report ? body.report : {};
  return {
    stopped: Array.isArray(report.stopped) ? report.stopped.length : 0,
    alive: Array.isArray(report.alive) ? report.alive.length : 0
  };
}
