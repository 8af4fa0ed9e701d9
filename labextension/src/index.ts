/**
 * nbcoord in JupyterLab 4 and Notebook 7, without a magic: a status item for the active notebook's kernel and
 * commands (palette and Kernel menu), all through nbcoord's server API (nbcoord/server; README, "Every kernel of a
 * server"). Nothing is inserted into a notebook; the only thing run in a kernel is `%load_ext nbcoord`, and only by
 * the explicit "Load nbcoord in this kernel" command.
 *
 * JupyterLab: the item sits in the status bar; the panel and the fleet view open as main-area tabs.
 * Notebook 7 (no status bar, one document per tab): the item sits in the notebook's toolbar; the panel and the
 * fleet view open in a new browser tab.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, Notification } from '@jupyterlab/apputils';
import { IFrame } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';

import { pageUrl, StopScope, stopKernel } from './api';
import { describe, KernelItem } from './item';
import { KernelsWatch } from './watch';

export const COMMANDS = {
  stopAll: 'nbcoord:stop-all',
  stopZombies: 'nbcoord:stop-zombies',
  showPanel: 'nbcoord:show-panel',
  openFleet: 'nbcoord:open-fleet',
  load: 'nbcoord:load'
} as const;

const CATEGORY = 'nbcoord';

function kernelOf(panel: NotebookPanel | null): Kernel.IKernelConnection | null {
  return panel?.sessionContext.session?.kernel ?? null;
}

function activate(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  statusBar: IStatusBar | null,
  palette: ICommandPalette | null,
  mainMenu: IMainMenu | null,
  labShell: ILabShell | null
): void {
  const settings = app.serviceManager.serverSettings;
  const watch = new KernelsWatch(settings, () => tracker.size > 0);
  /** Kernels this page loaded nbcoord in, until the server sees it there (it re-asks within 30 s). */
  const loaded = new Set<string>();
  const current = (): Kernel.IKernelConnection | null => kernelOf(tracker.currentWidget);
  const currentRow = () => {
    const kernel = current();
    return kernel ? watch.row(kernel.id) : undefined;
  };

  /** Draw `item` for the kernel `kernelOf()` names. */
  const bind = (item: KernelItem, kernel: () => Kernel.IKernelConnection | null): (() => void) => {
    const draw = () => {
      const id = kernel()?.id;
      const row = id ? watch.row(id) : undefined;
      if (id && row && row.status !== 'no-nbcoord') {
        loaded.delete(id);
      }
      if (id && row?.status === 'no-nbcoord' && loaded.has(id)) {
        item.render(
          [{ text: 'nbcoord: loaded, waiting for the server' }],
          'nbcoord was loaded in this kernel; the server asks it again within 30 s.'
        );
        return;
      }
      const { parts, title } = describe(row, watch.error);
      item.render(parts, title);
    };
    watch.changed.connect(draw);
    draw();
    return draw;
  };

  // A fresh view when something the page sees changes: a cell finished, a kernel (re)started, the active notebook.
  const watched = new WeakSet<NotebookPanel>();
  const follow = (panel: NotebookPanel) => {
    if (watched.has(panel)) {
      return;
    }
    watched.add(panel);
    panel.sessionContext.statusChanged.connect((_, status) => {
      if (status === 'idle' || status === 'restarting' || status === 'dead') {
        watch.soon();
      }
    });
    panel.sessionContext.kernelChanged.connect(() => watch.soon());
  };
  tracker.forEach(follow);
  tracker.widgetAdded.connect((_, panel) => {
    follow(panel);
    watch.soon();
  });
  tracker.currentChanged.connect(() => {
    watch.soon();
    app.commands.notifyCommandChanged();
  });
  watch.changed.connect(() => app.commands.notifyCommandChanged());

  const onItemClick = () => void app.commands.execute(COMMANDS.showPanel);
  if (statusBar) {
    const item = new KernelItem(onItemClick);
    const draw = bind(item, current);
    const activeStateChanged = new Signal<object, void>(item);
    tracker.currentChanged.connect(() => {
      draw();
      activeStateChanged.emit();
    });
    statusBar.registerStatusItem('nbcoord:status', {
      item,
      align: 'left',
      rank: 5,
      isActive: () => tracker.currentWidget !== null,
      activeStateChanged
    });
  } else {
    // Notebook 7: no status bar; each notebook's toolbar gets the item for its own kernel.
    const addToToolbar = (panel: NotebookPanel) => {
      const item = new KernelItem(onItemClick);
      const draw = bind(item, () => kernelOf(panel));
      panel.sessionContext.kernelChanged.connect(draw);
      panel.toolbar.insertAfter('spacer', 'nbcoord', item) || panel.toolbar.addItem('nbcoord', item);
      panel.disposed.connect(() => {
        watch.changed.disconnect(draw);
        item.dispose();
      });
    };
    tracker.forEach(addToToolbar);
    tracker.widgetAdded.connect((_, panel) => addToToolbar(panel));
  }

  /** The server page in a main-area tab (JupyterLab) or a new browser tab (Notebook 7). */
  const openPage = (id: string, label: string, url: string) => {
    if (!labShell) {
      window.open(url, '_blank', 'noopener');
      return;
    }
    const existing = Array.from(labShell.widgets('main')).find(widget => widget.id === id);
    if (existing) {
      labShell.activateById(id);
      return;
    }
    // The server's own page, same origin: its script reads the server's API with the session's cookies and XSRF.
    const frame = new IFrame({ sandbox: ['allow-scripts', 'allow-same-origin'], referrerPolicy: 'same-origin' });
    frame.url = url;
    const widget = new MainAreaWidget({ content: frame });
    widget.id = id;
    widget.addClass('nbcoord-panel');
    widget.title.label = label;
    widget.title.closable = true;
    labShell.add(widget, 'main');
    labShell.activateById(id);
  };

  const stop = async (scope: StopScope) => {
    const kernel = current();
    if (!kernel) {
      return;
    }
    try {
      const { stopped, alive } = await stopKernel(settings, kernel.id, scope);
      const what = scope === 'zombies' ? 'zombies' : 'background work';
      const left = alive ? `; ${alive} still alive (Force stop in the nbcoord panel)` : '';
      Notification.emit(`nbcoord: stopped ${stopped} thread${stopped === 1 ? '' : 's'} (${what})${left}`,
        alive ? 'warning' : 'success', { autoClose: 5000 });
    } catch (error) {
      Notification.error(`nbcoord: the stop failed: ${error instanceof Error ? error.message : String(error)}`);
    } finally {
      watch.soon();
    }
  };
  const answering = () => currentRow()?.status === 'ok';

  app.commands.addCommand(COMMANDS.stopAll, {
    label: 'Stop all background work',
    caption: "Stop every thread, task, pool and child process the current kernel's cells started (nbcoord)",
    isEnabled: answering,
    execute: () => stop('all')
  });
  app.commands.addCommand(COMMANDS.stopZombies, {
    label: 'Stop zombies',
    caption: "Stop the current kernel's zombies: background work of cells that were interrupted or failed (nbcoord)",
    isEnabled: answering,
    execute: () => stop('zombies')
  });
  app.commands.addCommand(COMMANDS.showPanel, {
    label: 'Show nbcoord panel',
    caption: "The current kernel in nbcoord's server page (nothing is added to the notebook)",
    isEnabled: () => current() !== null,
    execute: () => {
      const kernel = current();
      const panel = tracker.currentWidget;
      if (!kernel || !panel) {
        return;
      }
      openPage(`nbcoord-kernel-${kernel.id}`, `nbcoord: ${PathExt.basename(panel.context.path)}`,
        pageUrl(settings, kernel.id));
    }
  });
  app.commands.addCommand(COMMANDS.openFleet, {
    label: 'Open all kernels',
    caption: "Every kernel of this server in nbcoord's server page",
    execute: () => openPage('nbcoord-fleet', 'nbcoord: all kernels', pageUrl(settings))
  });
  app.commands.addCommand(COMMANDS.load, {
    label: 'Load nbcoord in this kernel',
    caption: 'Run %load_ext nbcoord in the current kernel',
    isVisible: () => currentRow()?.status === 'no-nbcoord',
    isEnabled: () => currentRow()?.status === 'no-nbcoord',
    execute: async () => {
      const kernel = current();
      if (!kernel) {
        return;
      }
      const reply = await kernel.requestExecute({ code: '%load_ext nbcoord', silent: false, store_history: false })
        .done;
      if (reply.content.status === 'ok') {
        loaded.add(kernel.id);
        Notification.success('nbcoord: loaded in this kernel', { autoClose: 5000 });
      } else {
        Notification.error('nbcoord: %load_ext nbcoord failed in this kernel (is nbcoord installed in its environment?)');
      }
      watch.soon();
    }
  });

  const ids = [COMMANDS.stopAll, COMMANDS.stopZombies, COMMANDS.showPanel, COMMANDS.openFleet, COMMANDS.load];
  if (palette) {
    for (const command of ids) {
      palette.addItem({ command, category: CATEGORY });
    }
  }
  if (mainMenu) {
    mainMenu.kernelMenu.addGroup(ids.map(command => ({ command })), 1000);
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbcoord:plugin',
  description: "nbcoord's status item and commands, from nbcoord's server API.",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, IMainMenu, ILabShell],
  activate
};

export default plugin;
