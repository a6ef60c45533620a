// Renders ups-doctor's markdown reports the way GitHub shows them and reports every defect found.
//
//   node render.mjs [--paste FILE]... [--screenshots DIR] [--tz ZONE] FILE.md...
//
// Markdown: micromark with the GFM extension (the CommonMark + GFM reference parser family that
// GitHub's cmark-gfm implements), raw HTML passed through and then judged the way GitHub's
// sanitizer would. Mermaid: every ```mermaid block is rendered with mermaid 10 and mermaid 11
// (GitHub has served both), in the light (`default`) and the dark theme, inside Debian's chromium
// driven by puppeteer-core (which never downloads a browser). Defects, one line each on stdout:
//   - a mermaid block that does not parse or render;
//   - raw HTML that GitHub would strip (any tag but the few a report uses on purpose), or an
//     element outside GitHub's allow-list in the rendered page;
//   - broken emphasis: an italic run (reports never use italics, so one comes from a stray `*` or
//     `_` in quoted text) or a literal `**`/`__` left in the rendered text;
//   - an xychart line with less than 3:1 contrast against the page in either theme;
//   - a gantt bar narrower than 1.5 px (a phase that does not show), or a time axis whose tick
//     labels do not match the times the tasks were given (past 60 s, or in the viewer's zone:
//     run with --tz Africa/Monrovia, whose offset at the epoch was -0:44:30);
//   - a file given with --paste longer than a GitHub comment (65,536 characters).
// Exit status 0 when there is no defect, 1 when there is one, 2 on a usage or set-up error.
import { readFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, resolve } from "node:path";
import { micromark } from "micromark";
import { gfm, gfmHtml } from "micromark-extension-gfm";
import puppeteer from "puppeteer-core";

const require = createRequire(import.meta.url);
const GITHUB_BODY_MAX = 65536;
// Tags a report writes on purpose; anything else in raw HTML is quoted text gone wrong.
const REPORT_TAGS = new Set(["details", "summary", "br", "code", "sub", "sup"]);
// GitHub's sanitizer keeps these elements (html-pipeline's allow-list); others are stripped.
const GITHUB_ELEMENTS = new Set(
  ("h1 h2 h3 h4 h5 h6 h7 h8 br b i strong em a pre code img tt div ins del sup sub p ol ul table " +
    "thead tbody tfoot blockquote dl dt dd kbd q samp var hr ruby rt rp li tr td th s strike " +
    "summary details caption figure figcaption abbr bdo cite dfn mark small span time wbr input")
    .split(" "),
);
const THEMES = [
  { name: "light", mermaid: "default", background: "#ffffff", text: "#1f2328" },
  { name: "dark", mermaid: "dark", background: "#0d1117", text: "#e6edf3" },
];
const MERMAIDS = [
  { name: "mermaid 10", path: require.resolve("mermaid10/dist/mermaid.min.js") },
  { name: "mermaid 11", path: require.resolve("mermaid11/dist/mermaid.min.js") },
];

function usage(msg) {
  console.error(`render.mjs: ${msg}`);
  process.exit(2);
}

const args = process.argv.slice(2);
const files = [];
const paste = new Set();
let shots = null;
let tz = "UTC";
while (args.length) {
  const a = args.shift();
  if (a === "--paste") paste.add(args.shift() ?? usage("--paste needs a file"));
  else if (a === "--screenshots") shots = args.shift() ?? usage("--screenshots needs a folder");
  else if (a === "--tz") tz = args.shift() ?? usage("--tz needs a zone");
  else files.push(a);
}
for (const p of paste) if (!files.includes(p)) files.push(p);
if (!files.length) usage("no report given");

const chromium = process.env.CHROMIUM || "/usr/bin/chromium";
const defects = [];
const defect = (file, what) => defects.push(`${file}: ${what}`);

// Line number of a character offset.
const lineOf = (src, offset) => src.slice(0, offset).split("\n").length;

// Raw HTML a report did not mean: every tag of every HTML token outside code.
function rawHtml(file, src) {
  const stripped = src.replace(/^(`{3,}|~{3,})[^\n]*\n[\s\S]*?^\1[`~]*[ \t]*$/gm, (m) => m.replace(/[^\n]/g, " "));
  // Code spans: a backtick run up to the next run of the same length (CommonMark's rule).
  const noCode = stripped.replace(/(?<!`)(`+)(?!`)([\s\S]*?[^`])\1(?!`)/g, (m) => m.replace(/[^\n]/g, " "));
  const tag = /<\/?([A-Za-z][A-Za-z0-9-]*)(?:\s[^<>]*)?\/?>/g;
  for (const m of noCode.matchAll(tag)) {
    // A backslash before `<` makes it text.
    if (noCode[m.index - 1] === "\\") continue;
    if (!REPORT_TAGS.has(m[1].toLowerCase())) {
      defect(file, `line ${lineOf(src, m.index)}: raw HTML \`${m[0]}\` would be stripped by GitHub (quoted text belongs in a code span)`);
    }
  }
}

function blocks(src) {
  const out = [];
  const fence = /^(`{3,})mermaid[ \t]*\n([\s\S]*?)\n\1[ \t]*$/gm;
  for (const m of src.matchAll(fence)) out.push({ line: lineOf(src, m.index), code: m[2] });
  return out;
}

const browser = await puppeteer.launch({
  executablePath: chromium,
  // A busy machine (CI, parallel tests) can take minutes over a long report; never give up early.
  protocolTimeout: 0,
  headless: true,
  // Root (CI) cannot use chromium's sandbox; the page renders only our own files.
  args: process.getuid && process.getuid() === 0 ? ["--no-sandbox"] : [],
});
try {
  // Each file once: its size, its raw HTML, its HTML.
  const docs = files.map((file) => {
    const src = readFileSync(file, "utf8");
    const chars = [...src].length;
    if (paste.has(file) && chars > GITHUB_BODY_MAX) {
      defect(file, `${chars} characters: a GitHub comment holds at most ${GITHUB_BODY_MAX}`);
    }
    rawHtml(file, src);
    return { file, html: micromark(src, { allowDangerousHtml: true, extensions: [gfm()], htmlExtensions: [gfmHtml()] }) };
  });
  // One page per mermaid version and theme (mermaid loaded once), every file rendered in it.
  for (const version of MERMAIDS) {
    for (const theme of THEMES) {
      const page = await browser.newPage();
      await page.emulateTimezone(tz);
      await page.setViewport({ width: 1012, height: 800, deviceScaleFactor: 1 });
      await page.setContent(
        `<!doctype html><html><head><meta charset="utf-8"><style>
          body { background: ${theme.background}; color: ${theme.text}; margin: 0;
                 font: 14px -apple-system, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; }
          /* GitHub's issue comment column */
          article { width: 780px; padding: 16px; }
          table { border-collapse: collapse; display: block; max-width: 100%; overflow: auto; }
          td, th { border: 1px solid #3d444d; padding: 6px 13px; }
          code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
        </style></head><body><article></article></body></html>`,
      );
      await page.addScriptTag({ path: version.path });
      await page.evaluate((theme) => {
        globalThis.mermaid.initialize({ startOnLoad: false, theme: theme.mermaid, securityLevel: "strict" });
      }, theme);
      for (const { file, html } of docs) {
        await page.evaluate((html) => {
          document.querySelector("article").innerHTML = html;
        }, html);
        const found = await page.evaluate(
          async (theme, elements, tz) => {
            const out = [];
            const mermaid = globalThis.mermaid;
            const article = document.querySelector("article");
            // Elements GitHub would strip, and emphasis that quoted text broke.
            for (const el of article.querySelectorAll("*")) {
              const name = el.tagName.toLowerCase();
              if (!elements.includes(name) && !el.closest("svg") && name !== "svg") {
                out.push(`element <${name}> would be stripped by GitHub (text: ${JSON.stringify(el.textContent.slice(0, 60))})`);
              }
              if (name === "em") out.push(`italic run ${JSON.stringify(el.textContent.slice(0, 80))}: a stray \`*\` or \`_\` in quoted text`);
            }
            const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
            for (let n = walker.nextNode(); n; n = walker.nextNode()) {
              if (n.parentElement.closest("code, pre")) continue;
              const m = n.textContent.match(/\*\*|__/);
              if (m) out.push(`stray \`${m[0]}\` in rendered text: ${JSON.stringify(n.textContent.slice(Math.max(0, m.index - 40), m.index + 40))}`);
            }
            // Contrast (WCAG relative luminance).
            const rgb = (c) => {
              const ctx = document.createElement("canvas").getContext("2d");
              ctx.fillStyle = "#000";
              ctx.fillStyle = c;
              ctx.fillRect(0, 0, 1, 1);
              return [...ctx.getImageData(0, 0, 1, 1).data.slice(0, 3)];
            };
            const lum = ([r, g, b]) =>
              [r, g, b].map((v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4))
                .reduce((a, v, i) => a + v * [0.2126, 0.7152, 0.0722][i], 0);
            const contrast = (a, b) => {
              const [x, y] = [lum(rgb(a)), lum(rgb(b))].sort((p, q) => q - p);
              return (x + 0.05) / (y + 0.05);
            };
            const codes = [...article.querySelectorAll("pre > code.language-mermaid")];
            let n = 0;
            for (const code of codes) {
              const source = code.textContent;
              const where = `mermaid block ${++n} (${source.split("\n").find((l) => !l.startsWith("%%")).trim()})`;
              const holder = document.createElement("div");
              code.parentElement.replaceWith(holder);
              let svg;
              try {
                await mermaid.parse(source);
                ({ svg } = await mermaid.render(`m${n}`, source));
              } catch (e) {
                out.push(`${where}: mermaid error: ${String(e.message || e).split("\n").slice(0, 3).join(" ")}`);
                holder.textContent = "(mermaid error)";
                continue;
              }
              holder.innerHTML = svg;
              const el = holder.querySelector("svg");
              if (!el || /Syntax error/i.test(el.textContent)) {
                out.push(`${where}: mermaid drew an error diagram`);
                continue;
              }
              el.style.maxWidth = "100%";
              el.style.height = "auto";
              if (/^xychart-beta/m.test(source) && /^\s*bar \[/m.test(source)) {
                // A bar per value: every non-zero value shows, in a colour that reads on the page.
                const values = source.match(/^\s*bar \[([^\]]*)\]/m)[1].split(",").map(Number);
                const bars = [...el.querySelectorAll('g[class^="bar-plot-"] rect')];
                if (bars.length !== values.length) out.push(`${where}: ${bars.length} bars drawn for ${values.length} values`);
                bars.forEach((r, i) => {
                  const h = r.getBBox().height;
                  if (values[i] > 0 && h < 1.5) out.push(`${where}: bar ${i + 1} (${values[i]}) is ${h.toFixed(2)} px high: it does not show`);
                  const fill = r.getAttribute("fill") || getComputedStyle(r).fill;
                  const c = contrast(fill, theme.background);
                  if (c < 3) out.push(`${where}: bar ${i + 1} is ${fill}, contrast ${c.toFixed(2)}:1 against the ${theme.name} background ${theme.background} (needs 3:1)`);
                });
              } else if (/^xychart-beta/m.test(source)) {
                const lines = [...el.querySelectorAll('g[class^="line-plot-"] path')];
                if (!lines.length) out.push(`${where}: no line drawn`);
                lines.forEach((p, i) => {
                  const stroke = p.getAttribute("stroke") || getComputedStyle(p).stroke;
                  const c = contrast(stroke, theme.background);
                  if (c < 3) out.push(`${where}: line ${i + 1} is ${stroke}, contrast ${c.toFixed(2)}:1 against the ${theme.name} background ${theme.background} (needs 3:1)`);
                });
              }
              if (/^gantt/m.test(source)) {
                // Task rects in source order, with the times (ms since the epoch) they were given.
                const tasks = [...source.matchAll(/:(?:crit, )?(\d+), (\d+)\s*$/gm)].map((m) => [+m[1], +m[2]]);
                const rects = [...el.querySelectorAll("rect.task")];
                rects.forEach((r, i) => {
                  const w = r.getBBox().width;
                  if (w < 1.5) out.push(`${where}: task ${i + 1} is ${w.toFixed(2)} px wide: it does not show`);
                });
                // Every tick label must read the time at its position; the scale comes from the
                // tasks (x of a rect's left edge = its start).
                if (tasks.length === rects.length && rects.length >= 2) {
                  // The leftmost bar starts at the earliest start, the rightmost ends at the
                  // latest end: that gives the time at every x.
                  const boxes = rects.map((r) => r.getBoundingClientRect());
                  const a = [Math.min(...boxes.map((b) => b.left)), Math.min(...tasks.map((t) => t[0]))];
                  const b = [Math.max(...boxes.map((b) => b.right)), Math.max(...tasks.map((t) => t[1]))];
                  const perPx = (b[1] - a[1]) / (b[0] - a[0] || 1);
                  const ticks = [...el.querySelectorAll("g.tick")];
                  const unitMs = /axisFormat %s\b/.test(source) ? 1000 : /axisFormat %Q\b/.test(source) ? 1 : null;
                  for (const t of ticks) {
                    const label = t.textContent.trim();
                    const x = (t.querySelector("line") || t).getBoundingClientRect().left;
                    const at = a[1] + (x - a[0]) * perPx;
                    let value;
                    if (unitMs) value = parseFloat(label) * unitMs;
                    else {
                      // Other formats: read `mm:ss`, `ss.mmm`, `ss` as elapsed time.
                      const parts = label.split(":").map(parseFloat);
                      value = parts.reduce((acc, v) => acc * 60 + v, 0) * 1000;
                    }
                    const span = Math.max(...tasks.map((t) => t[1])) - Math.min(...tasks.map((t) => t[0]));
                    if (!Number.isFinite(value) || Math.abs(value - at) > Math.max(0.02 * span, 50)) {
                      out.push(`${where}: axis label "${label}" stands where the time is ${(at / 1000).toFixed(3)} s (viewer time zone ${tz})`);
                      break;
                    }
                  }
                }
              }
            }
            return out;
          },
          theme,
          [...GITHUB_ELEMENTS],
          tz,
        ).catch((e) => [`page error: ${e.message}`]);
        for (const d of new Set(found)) defect(file, `${version.name}, ${theme.name} theme: ${d}`);
        if (shots) {
          mkdirSync(shots, { recursive: true });
          const stem = `${basename(dirname(resolve(file)))}-${basename(file, ".md")}-${version.name.replace(" ", "")}-${theme.name}`;
          // The top of the report: what a reader of the issue sees first.
          const height = await page.evaluate(() => document.querySelector("article").scrollHeight);
          await page.screenshot({ path: `${shots}/${stem}.png`, clip: { x: 0, y: 0, width: 812, height: Math.min(height + 32, 1400) } });
          let i = 0;
          for (const svg of await page.$$("article svg")) {
            await svg.screenshot({ path: `${shots}/${stem}-chart${++i}.png` });
          }
        }
      }
      await page.close();
    }
  }
} finally {
  await browser.close();
}
for (const d of defects) console.log(d);
console.error(`render.mjs: ${files.length} report(s), ${defects.length} defect(s)`);
process.exit(defects.length ? 1 : 0);
