// Ports in the browser: a web app alice runs in her notebook (tests/fixtures/port-app: a page
// whose script echoes through a websocket) is listed on the notebook's page with its address;
// Open shows it, websocket and all. Bob is refused until alice opens it to everyone, then sees
// it; a port nothing listens on and a stopped notebook each get a page that says so.
// Prints one JSON line with what it saw; exits non-zero when a step fails or a page logs an error.
//   node ports.mjs CONFIG.json
// CONFIG: {url, notebook: "ns/name", port, alice: [name, password], bob: [..], screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, screenshots, port } = config;
const [ns, name] = config.notebook.split('/');
const seen = {};
const browser = await launch();
const guards = [];
async function as(user) {
  const { context, guard, page } = await signedIn(browser, url, user, 1400);
  guards.push(guard);
  page.on('dialog', (dialog) => dialog.accept());
  return { context, page };
}
const text = async (page) => (await page.locator('body').innerText()).replace(/\s+/g, ' ').trim();
let page = null;
try {
  const alice = await as(config.alice);
  page = alice.page;
  await page.goto(`${url}/notebooks/${ns}/${name}`);
  const row = page.locator(`#ports tr[data-port="${port}"]`);
  await row.waitFor({ timeout: 30_000 });
  seen.row = (await row.innerText()).replace(/\s+/g, ' ').trim();
  seen.sharing = await row.locator('select').inputValue();
  await page.locator('#ports-card').screenshot({ path: `${screenshots}/ports-card.png` });
  const [app] = await Promise.all([
    alice.context.waitForEvent('page'),
    row.getByRole('link', { name: 'Open' }).click(),
  ]);
  await app.locator('#echo', { hasText: 'echo:' }).waitFor({ timeout: 30_000 });
  seen.address = app.url();
  seen.aliceSees = await text(app);
  await app.screenshot({ path: `${screenshots}/ports-app.png` });
  const nothing = new URL(seen.address);
  nothing.hostname = nothing.hostname.replace(/^\d+--/, '1--');
  const refused = await app.goto(nothing.href);
  seen.nothingListens = [refused.status(), await text(app)];

  const bob = await as(config.bob);
  const bobApp = await bob.context.newPage();
  const before = await bobApp.goto(seen.address);
  seen.bobBefore = [before.status(), await text(bobApp)];
  await bobApp.screenshot({ path: `${screenshots}/ports-refused.png` });

  await row.locator('select').selectOption('all');
  await page.waitForFunction((p) => document.querySelector(`#ports tr[data-port="${p}"] select`)?.value === 'all',
    port, { timeout: 15_000 });
  const after = await bobApp.goto(seen.address);
  await bobApp.locator('#echo', { hasText: 'echo:' }).waitFor({ timeout: 30_000 });
  seen.bobAfter = [after.status(), await text(bobApp)];

  await page.locator('#toggle').click();
  await page.locator('#state.stopped').waitFor({ timeout: 60_000 });
  const stopped = await bobApp.goto(seen.address);
  seen.stopped = [stopped.status(), await text(bobApp)];
  await page.locator('#ports-empty', { hasText: 'not running' }).waitFor({ timeout: 15_000 });
  seen.stoppedCard = await page.locator('#ports-empty').innerText();
  for (const guard of guards) guard.check();
} catch (error) {
  await page?.screenshot({ path: `${screenshots}/ports-failed.png`, fullPage: true });
  console.error(`step failed: ${error.message}\nseen so far: ${JSON.stringify(seen)}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
