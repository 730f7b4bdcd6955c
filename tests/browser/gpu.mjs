// The spawner form's GPU fields where CDI devices exist: which vendors are offered, more GPUs
// than the machine has refused under the count, and a notebook created with one GPU, shown in
// the list with its GPU's use. Prints one JSON line with what it saw; exits non-zero when a step fails or a page
// logs an error.
//   node gpu.mjs CONFIG.json
// CONFIG: {url, user: [name, password], image, screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, screenshots } = config;
const seen = {};
const browser = await launch();
try {
  const { guard, page } = await signedIn(browser, url, config.user);
  await page.goto(`${url}/new`);
  seen.vendors = await page.locator('#gpuVendor option')
    .evaluateAll((options) => options.map((o) => ({ value: o.value, label: o.textContent })));
  seen.countMax = await page.getByLabel('GPUs', { exact: true }).getAttribute('max');

  await page.getByLabel('Name', { exact: true }).fill('gform');
  await page.getByLabel(/Custom image/).fill(config.image);
  await page.getByLabel('None', { exact: true }).check();
  await page.getByLabel('GPU vendor').selectOption({ label: 'Fake GPU' });
  await page.getByLabel('GPUs', { exact: true }).fill('3');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  const countError = page.locator('[data-error-for="gpus.count"]:not(:empty)');
  await countError.waitFor();
  seen.tooMany = { message: await countError.textContent(), visible: await countError.isVisible() };
  await page.screenshot({ path: `${screenshots}/spawner-gpus.png`, fullPage: true });

  await page.getByLabel('GPUs', { exact: true }).fill('1');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.waitForURL(`${url}/`);
  const row = page.locator('#notebooks tr[data-name="gform"]');
  await row.locator('.state.ready').waitFor({ timeout: 120_000 });
  await row.locator('[data-gpu-utilization]').waitFor({ timeout: 30_000 });
  seen.listed = await row.locator('td').nth(6).textContent();

  guard.check();
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
