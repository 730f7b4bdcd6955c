// What every browser test of labforge's pages shares: Chromium as the tests run it, signing in,
// and a guard that fails the test on any script error of labforge's own pages.
import { chromium } from 'playwright-core';

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

export async function signIn(context, url, [user, password]) {
  const page = await context.newPage();
  await page.goto(`${url}/login`);
  await page.getByLabel('User name').fill(user);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(`${url}/`);
  return page;
}

/**
 * Collects console errors and uncaught exceptions of labforge's pages in `context` (a notebook's
 * own pages are its server's business). Chromium's "Failed to load resource" lines are left out:
 * they are the 4xx answers the pages show as messages, which the tests check themselves.
 */
export function pageErrors(context) {
  const errors = [];
  const ours = (page) => !new URL(page.url()).pathname.startsWith('/notebook/');
  context.on('page', (page) => {
    page.on('pageerror', (error) => { if (ours(page)) errors.push(`${page.url()}: ${error.message}`); });
    page.on('console', (message) => {
      if (message.type() === 'error' && ours(page) && !message.text().startsWith('Failed to load resource')) {
        errors.push(`${page.url()}: ${message.text()}`);
      }
    });
  });
  return {
    errors,
    /** Throws when a page logged an error. */
    check() {
      if (errors.length) throw new Error(`errors on labforge's pages:\n  ${errors.join('\n  ')}`);
    },
  };
}

/**
 * A new context of `browser` (at `width` × 900) with its error guard, and a page signed in there
 * as `user`.
 */
export async function signedIn(browser, url, user, width = 1280) {
  const context = await browser.newContext({ viewport: { width, height: 900 } });
  const guard = pageErrors(context);
  const page = await signIn(context, url, user);
  return { context, guard, page };
}
