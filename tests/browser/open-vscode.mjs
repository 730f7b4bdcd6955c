// Opens a code-server (VSCode in the browser) notebook in headless Debian Chromium, signed in to
// labforge with a session cookie, and uses it as a person would: waits for the workbench, opens a
// workspace file with Quick Open and checks its text in the editor, runs a command in the
// integrated terminal (its pty is served over the workbench's websocket) and, when told which
// file the command creates, waits for the explorer to list it and checks its text too. Saves a
// screenshot (also on failure). Exit code 0 only when all of that worked. The session cookie is
// the web app's (`--web`, its origin; the URL's own by default): a notebook on its own host sends
// the browser there to sign in and back.
//   node open-vscode.mjs --cookie NAME=VALUE [--web ORIGIN] --open FILE --expect TEXT --run COMMAND
//        [--terminal-creates FILE [--terminal-expect TEXT]] --screenshot PNG URL
import { chromium } from 'playwright-core';
import { parseArgs } from 'node:util';

const usage = 'usage: node open-vscode.mjs --cookie NAME=VALUE [--web ORIGIN] --open FILE --expect TEXT '
  + '--run COMMAND [--terminal-creates FILE [--terminal-expect TEXT]] --screenshot PNG URL';
let options;
try {
  options = parseArgs({
    allowPositionals: true,
    options: {
      cookie: { type: 'string' },
      web: { type: 'string' },
      open: { type: 'string' },
      expect: { type: 'string' },
      run: { type: 'string' },
      'terminal-creates': { type: 'string' },
      'terminal-expect': { type: 'string' },
      screenshot: { type: 'string' },
    },
  });
} catch (err) {
  console.error(`${err.message}\n${usage}`);
  process.exit(2);
}
const { values: args, positionals } = options;
const url = positionals[0];
if (!url || !args.cookie?.includes('=') || !args.open || !args.expect || !args.run
    || !args.screenshot) {
  console.error(usage);
  process.exit(2);
}
// Progress goes to stderr, so that a failure's report shows how far it got; on success, stdout
// repeats the steps and ends with "vscode: ok".
const steps = [];
const step = (text) => {
  steps.push(`vscode: ${text}`);
  console.error(`vscode: ${text}`);
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let page;
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const [name, ...rest] = args.cookie.split('=');
  // Host-only, as labforge sets it; a __Host- cookie is kept only with Secure and for / (browsers
  // take it on http://localhost too).
  await context.addCookies([{ name, value: rest.join('='), domain: new URL(args.web || url).hostname,
                              path: '/', secure: name.startsWith('__Host-') }]);
  page = await context.newPage();

  // The workbench talks to its server over websockets under the notebook's URL; record them and
  // the frames they carry, to show the terminal really went through one.
  const sockets = [];
  page.on('websocket', (ws) => {
    const socket = { url: ws.url(), received: 0, closed: false };
    sockets.push(socket);
    ws.on('framereceived', () => { socket.received += 1; });
    ws.on('close', () => { socket.closed = true; });
  });

  // An offline team server's workbench asks nothing of other hosts (no extension gallery): only
  // of the notebook's host and labforge's own (its sign-in).
  const ours = new Set([new URL(url).host, new URL(args.web || url).host]);
  const outside = [];
  page.on('request', (request) => {
    const target = new URL(request.url());
    if (target.protocol.startsWith('http') && !ours.has(target.host)) outside.push(request.url());
  });
  // Nor does it ask its own server for what is not there (code-server lacks Microsoft's vsda).
  const missing = [];
  page.on('response', (answer) => { if (answer.status() === 404) missing.push(answer.url()); });

  const response = await page.goto(url, { waitUntil: 'domcontentloaded', timeout: 60_000 });
  if (!response || response.status() >= 400) {
    throw new Error(`${url} answered ${response?.status()}`);
  }
  await page.waitForSelector('.monaco-workbench', { timeout: 90_000 });
  // The explorer lists the opened folder once the remote connection is up.
  await page.waitForSelector('.explorer-folders-view .monaco-list-row', { timeout: 90_000 });
  step(`workbench loaded: ${await page.title()}`);
  // No AI chat on a team's server unless its user turns it on.
  const chat = page.locator('.part.auxiliarybar', { hasText: /Chat|Agent/ });
  if (await chat.isVisible()) throw new Error('the AI chat panel is open');
  step('no chat panel');

  // Quick Open (its file search runs on the server), then the file's text in the editor.
  const quickInput = page.locator('.quick-input-widget input');
  const editorShows = async (file, text, how) => {
    await page.locator('.editor-instance .view-lines', { hasText: text })
      .waitFor({ timeout: 30_000 });
    step(`opened ${file} (${how}): the editor shows "${text}"`);
  };
  await page.locator('.monaco-workbench').click({ position: { x: 700, y: 450 } });
  await page.keyboard.press('Control+P');
  await quickInput.waitFor({ state: 'visible', timeout: 20_000 });
  await quickInput.fill(args.open);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: args.open }).first()
    .waitFor({ timeout: 30_000 });
  await page.keyboard.press('Enter');
  await editorShows(args.open, args.expect, 'Quick Open');

  // The integrated terminal: created from the command palette, typed into as a user would.
  const framesBefore = sockets.reduce((sum, s) => sum + s.received, 0);
  await page.keyboard.press('F1');
  await quickInput.waitFor({ state: 'visible', timeout: 20_000 });
  await quickInput.fill('>Terminal: Create New Terminal');
  await page.locator('.quick-input-list .monaco-list-row',
    { hasText: 'Terminal: Create New Terminal' }).first().waitFor({ timeout: 20_000 });
  await page.keyboard.press('Enter');
  const terminal = page.locator('.terminal-wrapper.active .xterm').first();
  await terminal.waitFor({ state: 'visible', timeout: 30_000 });
  // The shell has printed its prompt once shell integration marks the first command line.
  await page.locator('.terminal-wrapper.active .terminal-command-decoration').first()
    .waitFor({ timeout: 30_000 })
    .catch(() => step('no prompt mark seen (shell integration off?); typing anyway'));
  await terminal.click();
  await page.keyboard.type(args.run);
  await page.keyboard.press('Enter');
  step(`typed into the terminal: ${args.run}`);
  // The terminal draws on a canvas, so its text is not in the DOM: what the command wrote is
  // checked through the UI instead, as the file watcher lists the new file in the explorer, opened
  // from there (Quick Open may answer from the file list it cached before the file existed).
  if (args['terminal-creates']) {
    const created = args['terminal-creates'];
    const row = page.locator('.explorer-folders-view .monaco-list-row', { hasText: created })
      .first();
    await row.waitFor({ timeout: 30_000 });
    step(`the explorer lists ${created}`);
    if (args['terminal-expect']) {
      await row.click();
      await editorShows(created, args['terminal-expect'], 'explorer');
    }
  }
  const notebookSockets = sockets.filter((s) => s.url.startsWith(url.replace(/^http/, 'ws')));
  const framesAfter = sockets.reduce((sum, s) => sum + s.received, 0);
  if (notebookSockets.length === 0 || framesAfter <= framesBefore) {
    throw new Error(`no websocket traffic under ${url}: ${JSON.stringify(sockets)}`);
  }
  step(`websockets under the notebook URL: ${notebookSockets.length}, frames received: `
    + `${framesAfter}`);
  if (outside.length) throw new Error(`requests to other hosts: ${outside.join(', ')}`);
  step('no request to another host');
  if (missing.length) throw new Error(`answered 404: ${missing.join(', ')}`);
  step('no request answered 404');
  await page.screenshot({ path: args.screenshot });
  console.log([...steps, 'vscode: ok'].join('\n'));
} catch (err) {
  if (page) {
    await page.screenshot({ path: args.screenshot }).catch(() => {});
  }
  console.error(`vscode: failed: ${err.message}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
