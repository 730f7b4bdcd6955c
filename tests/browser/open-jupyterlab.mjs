// Opens a JupyterLab URL in headless Debian Chromium, waits for the launcher to render and saves a
// screenshot. Exit code 0 only when JupyterLab's UI really loaded.
//   node open-jupyterlab.mjs URL SCREENSHOT.png
import { chromium } from 'playwright-core';

const [url, screenshot] = process.argv.slice(2);
if (!url || !screenshot) {
  console.error('usage: node open-jupyterlab.mjs URL SCREENSHOT.png');
  process.exit(2);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await page.goto(url, { waitUntil: 'domcontentloaded', timeout: 60_000 });
  await page.waitForSelector('.jp-Launcher', { timeout: 60_000 });
  await page.screenshot({ path: screenshot });
  console.log(`loaded: ${await page.title()}`);
} finally {
  await browser.close();
}
