// API tokens in the browser, one person per browser: alice makes a token on the Tokens page (its
// secret shown once, a bad name named), sees it listed and revokes it; bob sees only his own; the
// admin sees both users' tokens and revokes bob's. No page may overflow at 1024 px.
// Prints one JSON line with what it saw; exits non-zero when a step fails or a page logs an error.
//   node tokens.mjs CONFIG.json
// CONFIG: {url, alice: [name, password], bob: [..], admin: [..], screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, screenshots } = config;
const seen = {};
const browser = await launch();
const guards = [];
async function as(user, width) {
  const { guard, page } = await signedIn(browser, url, user, width);
  guards.push(guard);
  page.on('dialog', (dialog) => dialog.accept());
  return page;
}
const overflow = (page) => page.evaluate(() => document.documentElement.scrollWidth > document.documentElement.clientWidth);
let page = null;
try {
  page = await as(config.alice, 1024);
  await page.goto(`${url}/`);
  await page.locator('details.user-menu summary').click();
  await page.getByRole('link', { name: 'API tokens' }).click();
  await page.waitForURL(`${url}/tokens`);
  await page.getByRole('button', { name: 'Make token' }).click();
  const nameError = page.locator('[data-error-for="name"]:not(:empty)');
  await nameError.waitFor({ timeout: 10_000 });
  seen.emptyName = await nameError.innerText();
  await page.getByLabel('Name', { exact: true }).fill('from the browser');
  await page.getByLabel('Expires in').selectOption('7d');
  await page.getByRole('button', { name: 'Make token' }).click();
  await page.locator('#made-token:not([hidden])').waitFor({ timeout: 10_000 });
  seen.token = await page.locator('#made-token-value').innerText();
  const row = page.locator('#tokens tbody tr', { hasText: 'from the browser' });
  await row.waitFor({ timeout: 10_000 });
  seen.aliceRow = (await row.innerText()).replace(/\s+/g, ' ').trim();
  seen.aliceOverflows = await overflow(page);
  seen.loginCommand = await page.locator('#login-command').innerText();
  await page.screenshot({ path: `${screenshots}/tokens-alice.png`, fullPage: true });
  await page.reload();
  seen.secretAfterReload = await page.locator('#made-token').isVisible();

  page = await as(config.bob, 1400);
  await page.goto(`${url}/tokens`);
  await page.locator('#tokens tbody tr').first().waitFor({ timeout: 10_000 });
  seen.bobSeesAlices = await page.locator('#tokens tbody tr', { hasText: 'from the browser' }).count();
  seen.bobSeesAllTokens = await page.locator('#all-tokens').count();
  await page.getByLabel('Name', { exact: true }).fill('bobs laptop');
  await page.getByRole('button', { name: 'Make token' }).click();
  await page.locator('#tokens tbody tr', { hasText: 'bobs laptop' }).waitFor({ timeout: 10_000 });

  page = await as(config.admin, 1400);
  await page.goto(`${url}/tokens`);
  const all = page.locator('#all-tokens tbody tr');
  await all.filter({ hasText: 'bobs laptop' }).waitFor({ timeout: 10_000 });
  seen.adminRows = (await all.allInnerTexts()).map((t) => t.replace(/\s+/g, ' ').trim());
  await page.screenshot({ path: `${screenshots}/tokens-admin.png`, fullPage: true });
  await all.filter({ hasText: 'bobs laptop' }).getByRole('button', { name: /Revoke/ }).click();
  await all.filter({ hasText: 'bobs laptop' }).waitFor({ state: 'detached', timeout: 10_000 });

  page = await as(config.alice, 1400);
  await page.goto(`${url}/tokens`);
  const mine = page.locator('#tokens tbody tr', { hasText: 'from the browser' });
  await mine.getByRole('button', { name: /Revoke/ }).click();
  await mine.waitFor({ state: 'detached', timeout: 10_000 });
  seen.aliceLeft = await page.locator('#tokens tbody tr', { hasText: 'from the browser' }).count();
  for (const guard of guards) guard.check();
} catch (error) {
  await page?.screenshot({ path: `${screenshots}/tokens-failed.png`, fullPage: true });
  console.error(`step failed: ${error.message}\nseen so far: ${JSON.stringify(seen)}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
