// Two people in one shared notebook, each in a browser of their own: the owner and the user it is
// shared with open the same .ipynb in JupyterLab through labforge (each signed in on the
// notebook's host), and each sees what the other types as it is typed (JupyterLab's real-time
// collaboration). Prints one JSON line with what each saw; exits non-zero when a step fails.
//   node coedit.mjs CONFIG.json
// CONFIG: {url, namespace, notebook, file, owner: [name, password], sharee: [..], screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, namespace, notebook, file, screenshots } = config;
const seen = {};
const browser = await launch();
const labs = [];

/** JupyterLab with `file` open, as `user` reaches it from the notebook's page. */
async function openFile(user) {
  const { context, page } = await signedIn(browser, url, user);
  await page.goto(`${url}/notebooks/${namespace}/${notebook}`);
  await page.locator('#state.ready').waitFor({ timeout: 60_000 });
  const [lab] = await Promise.all([
    context.waitForEvent('page'),
    page.getByRole('link', { name: 'Connect' }).click(),
  ]);
  await lab.waitForURL(/\/lab/, { timeout: 60_000 });
  const prefix = `/notebook/${namespace}/${notebook}/`;
  const here = new URL(lab.url());
  await lab.goto(`${here.origin}${prefix}lab/tree/${file}`);
  await lab.locator('.jp-Notebook .jp-Cell .cm-content').first().waitFor({ timeout: 90_000 });
  labs.push(lab);
  return lab;
}

/** Types `text` at the end of the first cell. */
async function typeInFirstCell(lab, text) {
  await lab.locator('.jp-Notebook .jp-Cell .cm-content').first().click();
  await lab.keyboard.press('Control+End');
  await lab.keyboard.type(text);
}

const firstCell = (lab) => lab.locator('.jp-Notebook .jp-Cell .cm-content').first();
try {
  const owner = await openFile(config.owner);
  const sharee = await openFile(config.sharee);
  await typeInFirstCell(owner, 'greeting = "typed by the owner"');
  await firstCell(sharee).filter({ hasText: 'typed by the owner' }).waitFor({ timeout: 20_000 });
  seen.shareeSaw = await firstCell(sharee).innerText();
  await typeInFirstCell(sharee, '  # and by the sharee');
  await firstCell(owner).filter({ hasText: 'and by the sharee' }).waitFor({ timeout: 20_000 });
  seen.ownerSaw = await firstCell(owner).innerText();
  await owner.screenshot({ path: `${screenshots}/coedit-owner.png` });
  await sharee.screenshot({ path: `${screenshots}/coedit-sharee.png` });
} catch (error) {
  for (const [i, lab] of labs.entries()) await lab.screenshot({ path: `${screenshots}/coedit-failed-${i}.png` }).catch(() => {});
  console.error(`step failed: ${error.message}\nseen so far: ${JSON.stringify(seen)}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
