/**
 * The status item: one line about the active notebook's kernel, from the watch's last view.
 *
 *   nbcoord: 12 threads · 2 zombies · GPU 3.1 GiB     (zombies highlighted while there are any)
 *   nbcoord: not loaded                               (the kernel answers; nbcoord is not loaded there)
 *   nbcoord: kernel busy in C                         (no answer: its main thread holds the GIL in a C call)
 *
 * Every value is set as text (`textContent`, `title`): nothing from the server is parsed as HTML.
 */
import { Widget } from '@lumino/widgets';

import { IKernelRow } from './api';

/** One piece of the line; `zombies` pieces are highlighted when `alert`. */
export interface IPart {
  text: string;
  alert?: boolean;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

const GIB = 1024 ** 3;

/** The line and its tooltip for a kernel's row; `error` is the last request's failure. */
export function describe(
  row: IKernelRow | undefined,
  error: string | null
): { parts: IPart[]; title: string } {
  if (row === undefined) {
    return error
      ? { parts: [{ text: 'nbcoord: server not answering' }], title: `nbcoord's server API: ${error}` }
      : { parts: [{ text: 'nbcoord: …' }], title: 'Asking the server about this kernel' };
  }
  switch (row.status) {
    case 'ok': {
      const summary = row.nbcoord;
      const threads = summary ? summary.threads : 0;
      const zombies = summary ? summary.zombies : 0;
      const gpu = row.gpu.reduce((sum, g) => sum + g.bytes + g.workers_bytes, 0);
      const parts: IPart[] = [
        { text: `nbcoord: ${plural(threads, 'thread')}` },
        { text: ' · ' },
        { text: plural(zombies, 'zombie'), alert: zombies > 0 }
      ];
      if (gpu > 0) {
        parts.push({ text: ' · ' }, { text: `GPU ${(gpu / GIB).toFixed(1)} GiB` });
      }
      const states = summary
        ? Object.entries(summary.threads_by_state)
            .map(([state, n]) => `${n} ${state}`)
            .join(', ')
        : '';
      return {
        parts,
        title: `Threads the cells started: ${plural(threads, 'thread')}${states ? ` (${states})` : ''}; ` +
          `${plural(zombies, 'zombie')}. Click for the nbcoord panel.`
      };
    }
    case 'no-nbcoord':
      return {
        parts: [{ text: 'nbcoord: not loaded' }],
        title: 'nbcoord is not loaded in this kernel: "Load nbcoord in this kernel" (Kernel menu) runs %load_ext nbcoord.'
      };
    case 'not-answering':
      if (row.execution_state === 'starting') {
        return { parts: [{ text: 'nbcoord: kernel starting' }], title: row.error ?? 'The kernel is starting.' };
      }
      return {
        parts: [{ text: 'nbcoord: kernel busy in C' }],
        title: `${row.error ?? 'The kernel does not answer.'} Click for the nbcoord panel (stacks read from outside).`
      };
    case 'dead':
      return { parts: [{ text: 'nbcoord: kernel dead' }], title: row.error ?? 'The kernel process is not running.' };
    default:
      return { parts: [{ text: 'nbcoord: error' }], title: row.error ?? 'nbcoord answered with an error.' };
  }
}

/** The item's widget: redrawn by `render`, clicked to run `onClick`. */
export class KernelItem extends Widget {
  constructor(onClick: () => void) {
    super();
    this.addClass('nbcoord-item');
    this.node.setAttribute('role', 'button');
    this.node.dataset.nbcoord = 'status';
    this._onClick = onClick;
    this.node.addEventListener('click', this._onClick);
  }

  render(parts: IPart[], title: string): void {
    const key = JSON.stringify([parts, title]);
    if (key === this._key) {
      return;
    }
    this._key = key;
    const spans = parts.map(part => {
      const span = document.createElement('span');
      span.textContent = part.text;
      if (part.alert) {
        span.className = 'nbcoord-alert';
      }
      return span;
    });
    this.node.replaceChildren(...spans);
    this.node.title = title;
  }

  dispose(): void {
    this.node.removeEventListener('click', this._onClick);
    super.dispose();
  }

  private _onClick: () => void;
  private _key = '';
}
