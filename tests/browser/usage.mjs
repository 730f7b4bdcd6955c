// Live resource use on the pages: the list's CPU and memory cells of a busy and an idle notebook,
// the busy one's page (its use following new samples, the memory warning), and the admin page
// sorted by CPU in use with its totals. Prints one JSON line with what it saw; exits non-zero
// when a step fails or a page logs an error.
//   node usage.mjs CONFIG.json
// CONFIG: {url, user: [name, password], admin: [name, password], screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, screenshots } = config;
const ns = config.user[0];
const seen = {};
const browser = await launch();
try {
  const { guard, page } = await signedIn(browser, url, config.user);
  const row = (name) => page.locator(`#notebooks tr[data-name="${name}"]`);
  await row('busy').locator('[data-cpu-cores]').waitFor({ timeout: 30_000 });
  await row('idle').locator('[data-cpu-cores]').waitFor({ timeout: 30_000 });
  const cores = (locator) => locator.locator('[data-cpu-cores]').getAttribute('data-cpu-cores').then(Number);
  seen.listBusyCores = await cores(row('busy'));
  seen.listIdleCores = await cores(row('idle'));
  seen.listBusyNearLimit = await row('busy').evaluate((tr) => tr.classList.contains('near-limit'));
  seen.listIdleNearLimit = await row('idle').evaluate((tr) => tr.classList.contains('near-limit'));
  await page.screenshot({ path: `${screenshots}/notebooks-usage.png`, fullPage: true });

  await page.goto(`${url}/notebooks/${ns}/busy`);
  await page.locator('#cpu-use [data-cpu-cores]').waitFor({ timeout: 30_000 });
  await page.locator('#memory-warning').waitFor({ state: 'visible', timeout: 30_000 });
  seen.pageWarning = await page.locator('#memory-warning').isVisible();
  seen.pageCores = await cores(page.locator('#cpu-use'));
  // New samples reach the open page: count the times the shown CPU use is replaced (in place, or
  // with the whole status when the notebook changed meanwhile).
  seen.pageUpdates = await page.evaluate(() => new Promise((resolve) => {
    let updates = 0;
    const observer = new MutationObserver((records) => {
      if (records.some((r) => r.target.id === 'cpu-use' || r.target.id === 'details')) updates += 1;
    });
    observer.observe(document.getElementById('details'), { childList: true, subtree: true });
    setTimeout(() => { observer.disconnect(); resolve(updates); }, 8000);
  }));
  await page.screenshot({ path: `${screenshots}/notebook-usage.png`, fullPage: true });

  const { guard: adminGuard, page: admin } = await signedIn(browser, url, config.admin, 1400);
  await admin.goto(`${url}/admin`);
  await admin.locator('#all tbody tr').first().waitFor();
  await admin.getByLabel('Sort by').selectOption('cpuUsed');
  seen.adminFirstByCpu = await admin.locator('#all tbody tr').first().getAttribute('data-key');
  seen.adminTotals = await admin.locator('#total-cpu').textContent();
  await admin.screenshot({ path: `${screenshots}/admin-usage.png`, fullPage: true });

  guard.check();
  adminGuard.check();
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
