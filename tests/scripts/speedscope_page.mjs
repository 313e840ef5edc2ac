#!/usr/bin/env node
// Opens a profile in the real speedscope (the npm package's built web app) inside Debian's
// Chromium, headless, driven by playwright-core, and reports what the page shows.
//
//   node tests/scripts/speedscope_page.mjs PROFILE SCREENSHOT.png [TITLE]
//
// In: PROFILE, any file speedscope imports (our exports: its JSON file format); its name is
// the one speedscope sees (it picks some importers by file name). TITLE, optional: passed
// as the `title` hash parameter, which speedscope also gives every profile as its name (so
// without it the profile names are the file's own).
// Out: SCREENSHOT.png, the page once loaded (Sandwich view); on stdout one JSON object:
//   frames      the Symbol Name of every row of the Sandwich view's table of the profile
//               shown, in its order (self weight descending, speedscope's default); the
//               table is virtualized (only the rows in view are in the DOM), so it is
//               scrolled through and every row collected;
//   rows        the same rows as {name, file, total, self}: file is the row's tooltip
//               (the frame's `file`, or null), total/self the cells' text ("20.00ms (67%)");
//   profiles    the names in the profile selector at the top (one per profile, in order);
//   profile     the name of the profile shown (the first, or `activeProfileIndex`'s);
//   by_profile  [{name, frames, rows}]: the same for every profile, in the file's order
//               (the keys p and n step through them, after the screenshot);
//   title       the document title less " - speedscope" (the file's `name`, or TITLE);
//   errors      what speedscope reported: its "Something went wrong" page, alerts (an
//               unrecognized format, an empty import), the import's exception (logged
//               as "Failed to load format"), console errors and uncaught page errors.
// Exits 0 once speedscope shows the profile or an error; 1 (message on stderr) when it
// shows neither within 30 s, or throws an exception it does not catch (then it would go
// on loading for ever: a frame without a name, an unknown profile type); 2 on bad usage.
// The browser and the server are always closed.
// Needs `cargo xtask setup`: the npm packages in <workspace>/.tools/node, /usr/bin/chromium.
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';

const LOAD_TIMEOUT_MS = 30_000;
// How long the page may go on after an uncaught error before it counts as failed.
const PAGE_ERROR_GRACE_MS = 2_000;
const workspace = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const modules = path.join(workspace, '.tools', 'node', 'node_modules');
const app = path.join(modules, 'speedscope', 'dist', 'release');

const [profileArg, screenshotArg, titleArg] = process.argv.slice(2);
if (!profileArg || !screenshotArg) {
  console.error('usage: node speedscope_page.mjs PROFILE SCREENSHOT.png [TITLE]');
  process.exit(2);
}
const profile = path.resolve(profileArg);
const screenshot = path.resolve(screenshotArg);
if (!fs.existsSync(profile)) {
  console.error(`speedscope_page: no such file: ${profile}`);
  process.exit(2);
}
if (!fs.existsSync(path.join(app, 'index.html'))) {
  console.error(`speedscope_page: ${app}/index.html missing (cargo xtask setup)`);
  process.exit(2);
}
const { chromium } = createRequire(path.join(modules, 'noop.js'))('playwright-core');

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript',
  '.css': 'text/css',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
};
const profilePath = `/profile/${encodeURIComponent(path.basename(profile))}`;

// The app's files under /, the profile at profilePath; nothing else.
function serve(req, res) {
  const url = new URL(req.url, 'http://127.0.0.1');
  let file;
  if (url.pathname === profilePath) {
    file = profile;
  } else {
    const rel = path.normalize(decodeURIComponent(url.pathname)).replace(/^[/\\]+/, '');
    file = path.join(app, rel || 'index.html');
    if (!file.startsWith(app + path.sep)) file = null;
  }
  if (!file) {
    res.writeHead(404).end();
    return;
  }
  fs.readFile(file, (err, data) => {
    if (err) {
      res.writeHead(404).end();
      return;
    }
    const type = TYPES[path.extname(file)] ?? 'application/octet-stream';
    res.writeHead(200, { 'content-type': type, 'cache-control': 'no-store' }).end(data);
  });
}

// In the page: the state speedscope is in (null while it is still loading).
function pageState() {
  const text = document.body ? document.body.innerText : '';
  if (text.includes('Something went wrong')) return 'error';
  const headers = [...document.querySelectorAll('th')].map((th) => th.textContent.trim());
  if (headers.includes('Symbol Name')) return 'sandwich';
  // Loaded, in another view (the tabs are only shown with a profile).
  if ([...document.querySelectorAll('div')].some((d) => d.textContent === '🥪Sandwich')) {
    return 'loaded';
  }
  return null;
}

// In the page: the Sandwich table's scroller, its rows' height and count, and the rows now
// in the DOM with their index. The table is a virtualized list: a fixed-height spacer
// (rows × row height) inside the scroller, holding a translated table of the rows in view.
function sandwichRows() {
  const th = [...document.querySelectorAll('th')].find((h) => h.textContent.trim() === 'Symbol Name');
  if (!th) return null;
  const header = th.closest('table');
  const scroller = header.nextElementSibling;
  const spacer = scroller && scroller.firstElementChild;
  if (!spacer) return { count: 0, rowHeight: 0, clientHeight: 0, rows: [] };
  const trs = [...spacer.querySelectorAll('tr')];
  const rowHeight = trs.length ? trs[0].getBoundingClientRect().height : 0;
  const top = spacer.getBoundingClientRect().top;
  const rows = trs.map((tr) => {
    const cells = [...tr.children];
    const name = cells[cells.length - 1];
    const num = (cell) => (cell ? cell.textContent.trim() : '');
    return {
      index: Math.round((tr.getBoundingClientRect().top - top) / rowHeight),
      name: name.textContent,
      file: name.getAttribute('title'),
      total: num(cells[0]),
      self: num(cells[1]),
    };
  });
  return {
    count: rowHeight ? Math.round(spacer.getBoundingClientRect().height / rowHeight) : 0,
    rowHeight,
    clientHeight: scroller.clientHeight,
    rows,
  };
}

// In the page: scrolls the Sandwich table's scroller to y.
function scrollSandwich(y) {
  const th = [...document.querySelectorAll('th')].find((h) => h.textContent.trim() === 'Symbol Name');
  const scroller = th.closest('table').nextElementSibling;
  scroller.scrollTop = y;
  return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
}

// In the page: the profile selector at the top of the toolbar, between the view tabs and
// the Export/Import/... buttons: with several profiles "NAME <span>(I/N)</span>" and a
// (hidden) drop-down table, one row per profile with the name as tooltip; with one
// profile its name alone, as a bare text node.
function profileNames() {
  const sandwich = [...document.querySelectorAll('div')].find((d) => d.textContent === '🥪Sandwich');
  const toolbar = sandwich && sandwich.parentElement && sandwich.parentElement.parentElement;
  if (!toolbar) return { current: null, index: 0, all: [] };
  const center = [...toolbar.childNodes].slice(1, -1);
  const selector = center.find((n) => n.nodeType === Node.ELEMENT_NODE);
  if (!selector) {
    const name = center.map((n) => n.textContent).join('').trim();
    return { current: name, index: 0, all: [name] };
  }
  const shown = selector.querySelector(':scope > span');
  const count = shown && shown.querySelector('span');
  const text = shown ? shown.textContent : selector.textContent;
  const current = text.slice(0, text.length - (count ? count.textContent.length : 0)).trim();
  const index = count ? Number(/\((\d+)\//.exec(count.textContent)?.[1] ?? 1) - 1 : 0;
  const all = [...selector.querySelectorAll('tbody tr')].map((tr) => tr.getAttribute('title') ?? tr.textContent);
  return { current, index, all: all.length ? all : [current] };
}

// In the page: two animation frames (speedscope has re-rendered).
function nextFrame() {
  return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
}

// The rows of the Sandwich table shown, all of them: the virtualized list is scrolled
// through a screenful at a time and each row kept at its index, then scrolled back.
async function readSandwich(page, errors) {
  const rows = [];
  let view = await page.evaluate(sandwichRows);
  if (!view) return rows;
  const total = view.count;
  const collect = () => {
    for (const row of view.rows) if (row.index >= 0 && row.index < total) rows[row.index] = row;
  };
  collect();
  const step = Math.max(view.clientHeight - view.rowHeight, view.rowHeight, 1);
  for (let y = step; y < total * view.rowHeight && rows.filter(Boolean).length < total; y += step) {
    await page.evaluate(scrollSandwich, y);
    view = await page.evaluate(sandwichRows);
    collect();
  }
  await page.evaluate(scrollSandwich, 0);
  const missing = [...Array(total).keys()].filter((i) => !rows[i]);
  if (missing.length) errors.push(`speedscope_page: rows ${missing.join(',')} of the Sandwich table not read`);
  return rows.filter(Boolean).map(({ name, file, total: t, self }) => ({ name, file, total: t, self }));
}

const errors = [];
let server;
let browser;
try {
  server = http.createServer(serve);
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const base = `http://127.0.0.1:${server.address().port}`;
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-background-networking'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  let dialogs = 0;
  page.on('dialog', (dialog) => {
    dialogs += 1;
    errors.push(`alert: ${dialog.message()}`);
    dialog.dismiss().catch(() => {});
  });
  let pageErrorAt = null;
  page.on('pageerror', (err) => {
    errors.push(`page error: ${err.message}`);
    pageErrorAt ??= Date.now();
  });
  page.on('console', async (msg) => {
    if (msg.type() === 'error') errors.push(`console error: ${msg.text()}`);
    if (msg.text().startsWith('Failed to load format')) {
      const args = msg.args();
      const why = args.length > 1 ? await args[1].evaluate((e) => String(e)).catch(() => '') : '';
      errors.push(`import failed: ${why || msg.text()}`);
    }
  });
  let hash = `profileURL=${encodeURIComponent(base + profilePath)}&view=sandwich`;
  if (titleArg !== undefined) hash += `&title=${encodeURIComponent(titleArg)}`;
  await page.goto(`${base}/index.html#${hash}`, { timeout: LOAD_TIMEOUT_MS });

  const deadline = Date.now() + LOAD_TIMEOUT_MS;
  let state = null;
  while (Date.now() < deadline) {
    state = await page.evaluate(pageState);
    if (state !== null || dialogs > 0) break;
    // An exception speedscope does not catch leaves it loading for ever.
    if (pageErrorAt !== null && Date.now() - pageErrorAt > PAGE_ERROR_GRACE_MS) break;
    await page.waitForTimeout(100);
  }
  if (state === null && dialogs === 0) {
    await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
    const why = pageErrorAt === null ? `within ${LOAD_TIMEOUT_MS / 1000} s` : 'after an uncaught error';
    throw new Error(`speedscope did not load ${profile} ${why} (screenshot: ${screenshot}); ${errors.join('; ')}`);
  }
  if (state === 'loaded') {
    // A viewer that ignored view=sandwich: the key 3 is the Sandwich tab.
    await page.keyboard.press('3');
    await page.waitForFunction(() => document.body.innerText.includes('Symbol Name'), null, { timeout: 5_000 }).catch(() => {});
    state = await page.evaluate(pageState);
  }
  if (state === 'error') {
    const text = await page.evaluate(() => document.body.innerText.trim());
    errors.unshift(`speedscope: ${text.replace(/\s+/g, ' ')}`);
  }
  // Let the console handlers (which await the page) finish.
  await page.evaluate(nextFrame);

  const names = await page.evaluate(profileNames);
  const title = (await page.title()).replace(/ - speedscope$/, '');
  const rows = state === 'sandwich' ? await readSandwich(page, errors) : [];
  await page.screenshot({ path: screenshot, fullPage: true });
  // Every profile's table: back to the first with the key p, then on with n.
  const byProfile = [];
  if (state === 'sandwich' && names.all.length > 1) {
    for (let i = names.index; i > 0; i -= 1) await page.keyboard.press('p');
    for (let i = 0; i < names.all.length; i += 1) {
      if (i > 0) await page.keyboard.press('n');
      await page.evaluate(nextFrame);
      const shown = await page.evaluate(profileNames);
      const these = await readSandwich(page, errors);
      byProfile.push({ name: shown.current, frames: these.map((r) => r.name), rows: these });
    }
  } else if (state === 'sandwich') {
    byProfile.push({ name: names.current, frames: rows.map((r) => r.name), rows });
  }
  process.stdout.write(
    `${JSON.stringify({
      frames: rows.map((r) => r.name),
      rows,
      profiles: names.all,
      profile: names.current,
      by_profile: byProfile,
      title,
      errors,
    })}\n`,
  );
} catch (err) {
  console.error(`speedscope_page: ${err && err.message ? err.message : err}`);
  process.exitCode = 1;
} finally {
  if (browser) await browser.close().catch(() => {});
  if (server) server.close();
}
