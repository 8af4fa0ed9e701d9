// The build of nbcoord's two ES modules, from the sources in js/src/ (esbuild, pinned in package.json):
//
//   js/src/panel/index.js -> js/panel.js   the panel (anywidget reads it as one module text: nbcoord/ui/widget.py)
//   js/src/fleet/index.js -> js/fleet.js   the server page's module (served by nbcoord/server/_handlers.py)
//
// The built files are git-ignored; the wheel ships them (pyproject's force-include), and tools/dev.py builds them
// before installing. Usage: `npm ci && npm run build`, or `node js/build.mjs OUTDIR` (tests/test_panel_js.py builds
// into a temporary folder and compares: the built files must be current).
import { build } from "esbuild";
import path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const outdir = path.resolve(process.argv[2] || here);

await build({
  entryPoints: { panel: path.join(here, "src", "panel", "index.js"), fleet: path.join(here, "src", "fleet", "index.js") },
  outdir,
  bundle: true,
  format: "esm",
  target: "es2020",
  charset: "ascii",
  legalComments: "none",
  logLevel: "warning",
  banner: { js: "// Built by js/build.mjs from js/src/ (esbuild): edit the sources there, never this file." },
});
