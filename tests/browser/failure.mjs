// What a notebook that failed to start shows in the UI: the list's state badge (its tooltip)
// and the notebook page's reason line. Prints one JSON line with both.
//   node failure.mjs URL USER PASSWORD NAMESPACE NAME
import { chromium } from 'playwright-core';

const [url, user, password, ns, name] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await (await browser.newContext()).newPage();
  await page.goto(`${url}/login`);
  await page.getByLabel('User name').fill(user);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(`${url}/`);
  const badge = page.locator(`#notebooks tr[data-name="${name}"] .state.error`);
  await badge.waitFor({ timeout: 60_000 });
  const listTitle = await badge.getAttribute('title');
  await page.goto(`${url}/notebooks/${ns}/${name}`);
  const reason = page.locator('#reason');
  await page.waitForFunction(() => document.getElementById('reason')?.textContent.length > 0);
  console.log(JSON.stringify({ listTitle, pageReason: await reason.textContent() }));
} finally {
  await browser.close();
}
