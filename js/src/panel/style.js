// @ts-check
/** The panel's style sheet: JupyterLab's theme variables, with fallbacks for other front ends. */
export const CSS = `
.nbc { --nbc-fg: var(--jp-ui-font-color1, #1f1f1f); --nbc-muted: var(--jp-ui-font-color2, #5c5c5c);
  --nbc-bg: var(--jp-layout-color1, #fff); --nbc-bg2: var(--jp-layout-color2, #eee);
  --nbc-line: var(--jp-border-color2, #e0e0e0); --nbc-err: var(--jp-error-color1, #c62828);
  --nbc-err-bg: var(--jp-error-color1, #c62828); --nbc-on-err: #fff;
  --nbc-ok: var(--jp-success-color0, #1b5e20); --nbc-warn: var(--jp-warn-color1, #f57c00);
  --nbc-accent: var(--jp-brand-color1, #1976d2);
  font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: var(--jp-ui-font-size1, 13px);
  color: var(--nbc-fg); background: var(--nbc-bg); border: 1px solid var(--nbc-line); border-radius: 4px;
  padding: 6px 10px 8px; line-height: 1.4; max-width: 1000px; box-sizing: border-box; }
body[data-jp-theme-light="false"] .nbc { --nbc-err: var(--jp-error-color2, #e57373);
  --nbc-err-bg: var(--jp-error-color2, #e57373); --nbc-on-err: #000; --nbc-ok: var(--jp-success-color2, #81c784); }
.nbc * { box-sizing: border-box; }
.nbc-head { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 12px; }
.nbc-title { font-weight: 600; letter-spacing: .02em; }
.nbc-muted { color: var(--nbc-muted); }
.nbc-small { font-size: var(--jp-ui-font-size0, 11px); }
.nbc-code { font-family: var(--jp-code-font-family, monospace); font-size: var(--jp-code-font-size, 12px); }
.nbc-fig { display: inline-flex; align-items: center; gap: 5px; white-space: nowrap; }
.nbc-fig b { font-weight: 600; }
.nbc-spacer { flex: 1 1 auto; }
.nbc-head-actions { display: inline-flex; align-items: center; gap: 8px; margin-left: auto; }
.nbc-chip { display: inline-block; border-radius: 9px; padding: 0 7px; white-space: nowrap;
  font-size: var(--jp-ui-font-size0, 11px); background: var(--nbc-bg2); color: var(--nbc-fg); }
.nbc-chip.err { background: var(--nbc-err-bg); color: var(--nbc-on-err); }
.nbc-chip.warn { background: transparent; box-shadow: inset 0 0 0 1px var(--nbc-warn); color: var(--nbc-fg); }
.nbc-chip.ok { background: transparent; box-shadow: inset 0 0 0 1px var(--nbc-ok); color: var(--nbc-ok); }
.nbc-btn { font: inherit; font-size: var(--jp-ui-font-size0, 11px); line-height: 1.5; cursor: pointer;
  color: var(--nbc-fg); background: var(--nbc-bg2); border: 1px solid var(--jp-border-color1, #bdbdbd);
  border-radius: 3px; padding: 0 8px; }
.nbc-btn:hover { background: var(--jp-layout-color3, #ddd); }
.nbc-btn.danger { background: var(--nbc-err-bg); border-color: var(--nbc-err-bg); color: var(--nbc-on-err);
  font-weight: 600; font-size: var(--jp-ui-font-size1, 13px); padding: 1px 12px; }
.nbc-btn.danger:hover { filter: brightness(.92); }
.nbc-btn.wide { font-size: var(--jp-ui-font-size1, 13px); padding: 1px 10px; }
.nbc-btn.busy { cursor: progress; }
.nbc-btn:disabled { cursor: not-allowed; background: var(--nbc-bg); border-color: var(--nbc-line);
  color: var(--nbc-muted); font-weight: 400; }
.nbc-row .nbc-btn { background: transparent; border-color: transparent; color: var(--nbc-muted); }
.nbc-row:hover .nbc-btn, .nbc-row .nbc-btn:focus, .nbc-row .nbc-btn.busy { border-color: var(--jp-border-color1, #bdbdbd);
  background: var(--nbc-bg); color: var(--nbc-fg); }
.nbc-status { margin-top: 3px; }
.nbc-banner { margin-top: 4px; padding: 3px 8px; border-left: 3px solid var(--nbc-warn);
  background: var(--nbc-bg2); color: var(--nbc-fg); }
.nbc-ways { margin-top: 3px; display: grid; gap: 2px; }
.nbc-way { display: flex; gap: 8px; align-items: baseline; }
.nbc-way .nbc-btn { min-width: 9em; }
.nbc-verdict { margin-top: 3px; font-weight: 600; }
.nbc-sec { margin-top: 7px; padding-top: 5px; border-top: 1px solid var(--nbc-line); }
.nbc-sec-title { font-weight: 600; margin-bottom: 3px; display: flex; gap: 8px; align-items: baseline; flex-wrap: wrap; }
.nbc-filter { font: inherit; font-size: var(--jp-ui-font-size0, 11px); font-weight: 400; margin-left: auto;
  color: var(--nbc-fg); background: var(--nbc-bg); border: 1px solid var(--jp-border-color1, #bdbdbd);
  border-radius: 3px; padding: 0 6px; width: 16em; }
.nbc-filter::placeholder { color: var(--nbc-muted); opacity: 1; }
.nbc-scroll { max-height: 24em; overflow-y: auto; }
.nbc-scroll.short { max-height: 10em; }
.nbc-group { margin: 2px 0 4px; }
.nbc-ghead { display: flex; align-items: center; gap: 8px; cursor: pointer; padding: 1px 2px; border-radius: 3px; }
.nbc-caret { width: 1em; display: inline-block; color: var(--nbc-muted); }
.nbc-line { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; max-width: 32em; }
.nbc-row { display: grid; grid-template-columns: 10px minmax(10em, 18em) 3em minmax(8em, 1fr) 7em 4.5em auto;
  align-items: center; gap: 8px; padding: 1px 2px 1px 18px; border-left: 3px solid transparent; }
.nbc-row.zombie { border-left-color: var(--nbc-err-bg); }
.nbc-name { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nbc-dot { width: 9px; height: 9px; border-radius: 50%; background: var(--jp-ui-font-color3, #bdbdbd); }
.nbc-dot.running { background: var(--jp-success-color1, #388e3c); }
.nbc-dot.waiting { background: var(--nbc-accent); }
.nbc-dot.stopping { background: var(--nbc-warn); }
.nbc-dot.zombie { background: var(--nbc-err-bg); }
.nbc-info { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nbc-actions { display: flex; gap: 4px; justify-content: flex-end; }
.nbc-why { color: var(--nbc-err); }
.nbc-more { margin: 1px 0 3px 18px; display: flex; gap: 8px; align-items: baseline; }
.nbc-link { font: inherit; background: none; border: none; padding: 0; cursor: pointer; color: var(--nbc-fg);
  text-decoration: underline; }
.nbc-pre { margin: 2px 0 4px 30px; padding: 4px 6px; max-height: 16em; overflow: auto; white-space: pre;
  background: var(--nbc-bg2); color: var(--nbc-fg); border-radius: 3px; font-family: var(--jp-code-font-family, monospace);
  font-size: var(--jp-code-font-size, 12px); }
.nbc-q { display: grid; grid-template-columns: minmax(8em, 14em) 120px 7em minmax(8em, 1fr) 120px 9em; gap: 10px;
  align-items: center; padding: 1px 2px; }
.nbc-mem { display: grid; grid-template-columns: minmax(7em, 10em) 120px minmax(8em, 1fr) 120px minmax(12em, auto); gap: 10px;
  align-items: center; padding: 1px 2px; }
.nbc-range { font-variant-numeric: tabular-nums; white-space: nowrap; }
.nbc-cellmem { display: flex; gap: 8px; align-items: baseline; padding: 1px 2px; }
.nbc-bar-bg { fill: var(--jp-layout-color3, #e0e0e0); }
.nbc-bar { fill: var(--nbc-accent); }
.nbc-bar.warn { fill: var(--nbc-warn); }
.nbc-bar.err { fill: var(--nbc-err-bg); }
.nbc-spark { fill: none; stroke: var(--nbc-accent); stroke-width: 1.3; }
.nbc-spark-area { fill: var(--jp-brand-color3, #bbdefb); opacity: .6; stroke: none; }
.nbc-spark-base { stroke: var(--nbc-line); stroke-width: 1; }
.nbc-sentence { padding: 1px 2px; }
.nbc-sentence::before { content: "\\26A0\\FE0E  "; }
.nbc-kids { margin-left: 18px; }
.nbc-sess { margin: 2px 0 4px; }
.nbc.stale .nbc-body, .nbc.stale .nbc-head, .nbc.stale .nbc-status { color: var(--nbc-muted); }
.nbc.stale .nbc-body *, .nbc.stale .nbc-head * { color: var(--nbc-muted); }
.nbc.stale .nbc-chip { background: transparent; box-shadow: inset 0 0 0 1px var(--nbc-line); }
.nbc.stale .nbc-dot, .nbc.stale .nbc-bar, .nbc.stale .nbc-spark-area { filter: grayscale(1); }
.nbc.stale .nbc-spark { stroke: var(--nbc-muted); }
`;
