// Notebooks waiting for their turn to start, as their owner sees them: the list's state cell says
// each one's place in line under its "starting" badge, and the notebook's page says it too.
// Prints one JSON line with what it saw; exits non-zero when a step fails or a page logs an error.
//   node line.mjs CONFIG.json
// CONFIG: {url, user: [name, password], waiting: {notebook: "Nth in line", ...}, screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, screenshots } = config;
const seen = { list: {}, page: {} };
const browser = await launch();
try {
  const { guard, page } = await signedIn(browser, url, config.user);
  try {
    for (const [name, place] of Object.entries(config.waiting)) {
      const row = page.locator(`#notebooks tr[data-name="${name}"]`);
      await row.locator('.state.starting').waitFor({ timeout: 30_000 });
      await row.locator('.state-reason', { hasText: place }).waitFor({ timeout: 30_000 });
      seen.list[name] = (await row.locator('td').nth(1).innerText()).replace(/\s+/g, ' ').trim();
    }
    await page.screenshot({ path: `${screenshots}/line-list.png`, fullPage: true });
    for (const [name, place] of Object.entries(config.waiting)) {
      await page.goto(`${url}/notebooks/${config.user[0]}/${name}`);
      await page.locator('#reason', { hasText: place }).waitFor({ timeout: 30_000 });
      seen.page[name] = await page.locator('#reason').innerText();
    }
  } catch (error) {
    await page.screenshot({ path: `${screenshots}/line-failed.png`, fullPage: true });
    throw error;
  }
  guard.check();
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
