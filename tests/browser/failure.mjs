// What a notebook that failed to start shows in the UI: the list's state badge (its tooltip)
// and the notebook page's reason line. Prints one JSON line with both.
// The runtime retries a failed start, so the page is read once it shows the failure (EXPECT, a
// part of its reason), as its user would wait for it.
//   node failure.mjs URL USER PASSWORD NAMESPACE NAME EXPECT
import { chromium } from 'playwright-core';

const [url, user, password, ns, name, expect] = process.argv.slice(2);
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
  const badge = page.locator(`#notebooks tr[data-name="${name}"] .state.error[title*="${expect}"]`);
  await badge.waitFor({ timeout: 60_000 });
  const listTitle = await badge.getAttribute('title');
  await page.goto(`${url}/notebooks/${ns}/${name}`);
  // Read in the same moment it matched: the runtime's next retry shows "pulling" again.
  const shown = await page.waitForFunction((part) => {
    const text = document.getElementById('reason')?.textContent;
    return text?.includes(part) ? text : null;
  }, expect, { timeout: 60_000 });
  console.log(JSON.stringify({ listTitle, pageReason: await shown.jsonValue() }));
} finally {
  await browser.close();
}
