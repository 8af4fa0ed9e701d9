/**
 * One watch of the server's kernels per page, whatever the number of notebooks: a `Poll` of
 * `GET nbcoord/api/kernels` every 3 s (one request answers for every kernel), in standby while the page is hidden
 * (no request at all: `linger` 0), backing off on errors.
 *
 * Between ticks, `soon()` asks for a fresh view when something the page sees has changed (a cell finished, the
 * active notebook or its kernel changed, a command ran): it is answered at once when the last request is at least
 * `MIN_GAP_MS` old, else when it is, and never while the page is hidden. So the page sends at most one request
 * per 3 s while it only watches, and at most one a second while the user runs cells.
 */
import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { fetchKernels, IKernelRow } from './api';

export const INTERVAL_MS = 3000;
export const MIN_GAP_MS = 1000;

export class KernelsWatch {
  constructor(settings: ServerConnection.ISettings, wanted: () => boolean) {
    this._settings = settings;
    this._wanted = wanted;
    this._poll = new Poll({
      factory: () => this._fetch(),
      frequency: { interval: INTERVAL_MS, backoff: true, max: 30 * 1000 },
      linger: 0,
      name: 'nbcoord:kernels',
      standby: 'when-hidden'
    });
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  /** Emitted after each answer (or failure) of the server. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The last answer's row of that kernel; undefined when the server did not list it (yet). */
  row(kernelId: string): IKernelRow | undefined {
    return this._rows.get(kernelId);
  }

  /** The last request's failure, one sentence; null after an answer. */
  get error(): string | null {
    return this._error;
  }

  /** Whether the server has answered at least once. */
  get answered(): boolean {
    return this._answered;
  }

  /** A fresh view as soon as allowed (see the module's comment). */
  soon(): void {
    if (this._timer !== 0) {
      return;
    }
    const wait = Math.max(0, this._last + MIN_GAP_MS - Date.now());
    this._timer = window.setTimeout(() => {
      this._timer = 0;
      // Something changed: a fresh view, not one the server collected up to 1 s ago for another page.
      this._fresh = true;
      void this._poll.refresh();
    }, wait);
  }

  dispose(): void {
    document.removeEventListener('visibilitychange', this._onVisibility);
    window.clearTimeout(this._timer);
    this._poll.dispose();
  }

  private _onVisibility = (): void => {
    if (document.visibilityState === 'visible') {
      this.soon();
    }
  };

  private async _fetch(): Promise<void> {
    if (!this._wanted() || document.visibilityState === 'hidden') {
      return; // no notebook to show a kernel of, or hidden: nothing to ask
    }
    this._last = Date.now();
    const fresh = this._fresh;
    this._fresh = false;
    try {
      const view = await fetchKernels(this._settings, fresh);
      this._rows = new Map(view.kernels.map(row => [row.id, row]));
      this._error = null;
      this._answered = true;
    } catch (error) {
      this._error = error instanceof Error ? error.message : String(error);
      this._changed.emit();
      throw error; // the poll backs off
    }
    this._changed.emit();
  }

  private _settings: ServerConnection.ISettings;
  private _wanted: () => boolean;
  private _poll: Poll;
  private _rows = new Map<string, IKernelRow>();
  private _error: string | null = null;
  private _answered = false;
  private _last = 0;
  private _timer = 0;
  private _fresh = false;
  private _changed = new Signal<this, void>(this);
}
