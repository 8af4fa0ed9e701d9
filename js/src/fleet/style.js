// @ts-check
/** The server page's style sheet, light and dark. */
export const CSS = `
.nbf { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; font-size: 13px; color: #1f1f1f;
  margin: 12px 16px; line-height: 1.4; }
.nbf h1 { font-size: 17px; margin: 0 0 2px; }
.nbf-muted { color: #616161; }
.nbf-summary { margin: 0 0 10px; }
.nbf-error { color: #b71c1c; }
.nbf table { border-collapse: collapse; width: 100%; }
.nbf th { text-align: left; font-weight: 600; border-bottom: 2px solid #e0e0e0; padding: 4px 8px; white-space: nowrap; }
.nbf td { border-bottom: 1px solid #eee; padding: 4px 8px; vertical-align: top; }
.nbf td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.nbf-path { font-weight: 600; word-break: break-all; }
.nbf-id { font-family: monospace; font-size: 11px; }
.nbf-chip { display: inline-block; border-radius: 9px; padding: 0 7px; margin: 0 3px 2px 0; font-size: 11px;
  white-space: nowrap; background: #eee; }
.nbf-chip.zombies, .nbf-chip.dead, .nbf-chip.error { background: #d32f2f; color: #fff; }
.nbf-chip.gpu { background: #6a1b9a; color: #fff; }
.nbf-chip.stuck, .nbf-chip.not-answering { background: #f57c00; color: #fff; }
.nbf-chip.ok { background: transparent; box-shadow: inset 0 0 0 1px #388e3c; color: #388e3c; }
.nbf button { font: inherit; font-size: 11px; cursor: pointer; border: 1px solid #bdbdbd; border-radius: 3px;
  background: #f5f5f5; padding: 1px 8px; margin: 0 4px 2px 0; }
.nbf button.danger { background: #d32f2f; border-color: #d32f2f; color: #fff; }
.nbf button:disabled { opacity: .5; cursor: default; }
.nbf-result { font-size: 11px; }
.nbf-doing { font-size: 11px; max-width: 40em; }
@media (prefers-color-scheme: dark) {
  .nbf { color: #e0e0e0; background: #121212; } .nbf-muted { color: #9e9e9e; }
  .nbf th { border-color: #424242; } .nbf td { border-color: #303030; }
  .nbf-chip { background: #333; } .nbf button { background: #2a2a2a; color: #e0e0e0; border-color: #555; }
}
`;
