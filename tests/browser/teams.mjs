// A team in the browser, one person per browser: a member with `edit` shares the team's notebook
// from its page (the dialog warns that a share works as the owner), the user it is shared with
// finds it under "Shared with me", the namespace's owner adds a member on the list page, a
// viewer sees the members without the form, and the admin sees the namespace on the admin page;
// the admin sets the namespace's quota there, and the editor's resize past it is refused on the
// notebook's page with the numbers, one within it is taken.
// Prints one JSON line with what it saw; exits non-zero when a step fails or a page logs an error.
//   node teams.mjs CONFIG.json
// CONFIG: {url, team, notebook, editor: [name, password], sharee: [..], owner: [..], viewer: [..],
//          admin: [..], newMember, screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, team, notebook, screenshots } = config;
const seen = {};
const browser = await launch();
const guards = [];
async function as(user) {
  const { guard, page } = await signedIn(browser, url, user);
  guards.push(guard);
  return page;
}
let page = null;
try {
  // The admin gives the team namespace a quota on the admin page.
  page = await as(config.admin);
  await page.goto(`${url}/admin`);
  await page.locator('#q-namespace').fill(team);
  await page.locator('#q-cpu').fill('1');
  await page.locator('#q-notebooks').fill('4');
  await page.getByRole('button', { name: 'Set quota' }).click();
  const quotaRow = page.locator(`#quotas tr[data-namespace="${team}"]`);
  await quotaRow.filter({ hasText: 'of 1' }).waitFor({ timeout: 10_000 });
  seen.quotaRow = (await quotaRow.innerText()).replace(/\s+/g, ' ').trim();
  await page.screenshot({ path: `${screenshots}/teams-quotas.png`, fullPage: true });

  // The editor sees the quota on the notebook's page; a resize past it is refused with the
  // numbers, one within it is taken.
  page = await as(config.editor);
  await page.goto(`${url}/notebooks/${team}/${notebook}`);
  const quotaLine = page.locator('#resources #quota-use');
  await quotaLine.waitFor({ timeout: 10_000 });
  seen.quotaLine = await quotaLine.innerText();
  const cpu = await page.locator('#resize-cpu').inputValue();
  await page.locator('#resize-cpu').fill('2');
  await page.getByRole('button', { name: 'Resize' }).click();
  const resizeError = page.locator('#resize-error');
  await resizeError.filter({ hasText: 'quota' }).waitFor({ timeout: 10_000 });
  seen.resizeRefused = await resizeError.innerText();
  await page.locator('#resize-cpu').fill('5000');
  await page.getByRole('button', { name: 'Resize' }).click();
  const cpuError = page.locator('#resources [data-error-for="cpu"]');
  await cpuError.filter({ hasText: 'allowed' }).waitFor({ timeout: 10_000 });
  seen.resizeTooBig = await cpuError.innerText();
  // The same amount again: taken, and nothing restarts for it.
  await page.locator('#resize-cpu').fill(cpu);
  const [patched] = await Promise.all([
    page.waitForResponse((r) => r.request().method() === 'PATCH', { timeout: 10_000 }),
    page.getByRole('button', { name: 'Resize' }).click(),
  ]);
  seen.resizeStatus = patched.status();
  await page.waitForFunction(() => !document.querySelector('#resources [data-error-for="cpu"]').textContent, null, { timeout: 10_000 });
  seen.resizeError = await resizeError.innerText();
  await page.screenshot({ path: `${screenshots}/teams-resources.png`, fullPage: true });

  // The editor shares the notebook with the sharee, from its page.
  await page.goto(`${url}/notebooks/${team}/${notebook}`);
  seen.warning = await page.locator('#sharing .warning').innerText();
  await page.getByLabel('User', { exact: true }).fill('nobody-at-all');
  await page.getByRole('button', { name: 'Share', exact: true }).click();
  const error = page.locator('#sharing [data-error-for="user"]');
  await error.filter({ hasText: 'no user' }).waitFor({ timeout: 10_000 });
  seen.unknownUser = await error.innerText();
  await page.getByLabel('User', { exact: true }).fill(config.sharee[0]);
  await page.getByRole('button', { name: 'Share', exact: true }).click();
  await page.locator(`#shares li[data-user="${config.sharee[0]}"]`).waitFor({ timeout: 10_000 });
  seen.shares = await page.locator('#shares').innerText();
  await page.screenshot({ path: `${screenshots}/teams-share.png`, fullPage: true });

  // The sharee finds it under "Shared with me".
  page = await as(config.sharee);
  const row = page.locator(`#shared tr[data-name="${notebook}"]`);
  await row.waitFor({ timeout: 20_000 });
  seen.sharedRow = (await row.innerText()).replace(/\s+/g, ' ').trim();
  await page.screenshot({ path: `${screenshots}/teams-shared-with-me.png`, fullPage: true });

  // The owner picks the team namespace and adds a member.
  page = await as(config.owner);
  await page.getByLabel('User menu').click();
  await page.locator(`#namespace-picker option[value="${team}"]`).waitFor({ state: 'attached', timeout: 10_000 });
  await page.locator('#namespace-picker').selectOption(team);
  await page.waitForURL(`${url}/?ns=${team}`);
  await page.locator('#members-section').waitFor({ timeout: 10_000 });
  await page.locator('#member-user').fill(config.newMember);
  await page.locator('#member-role').selectOption('view');
  await page.getByRole('button', { name: 'Add member' }).click();
  await page.locator(`#members li[data-user="${config.newMember}"]`).waitFor({ timeout: 10_000 });
  seen.members = (await page.locator('#members').innerText()).split('\n').map((l) => l.trim()).filter(Boolean);
  seen.ownerLine = await page.locator('#members-owner').innerText();
  await page.screenshot({ path: `${screenshots}/teams-members.png`, fullPage: true });

  // A viewer sees who is in, and no form to change it.
  page = await as(config.viewer);
  await page.goto(`${url}/?ns=${team}`);
  await page.locator('#members-section').waitFor({ timeout: 10_000 });
  await page.locator(`#notebooks tr[data-name="${notebook}"]`).waitFor({ timeout: 20_000 });
  seen.viewerForm = await page.locator('#add-member').isVisible();
  seen.viewerLine = await page.locator('#members-owner').innerText();

  // The admin sees the namespace with its owner and members.
  page = await as(config.admin);
  await page.goto(`${url}/admin`);
  const nsRow = page.locator(`#namespaces tr[data-name="${team}"]`);
  await nsRow.waitFor({ timeout: 10_000 });
  seen.adminRow = (await nsRow.innerText()).replace(/\s+/g, ' ').trim();
  await page.screenshot({ path: `${screenshots}/teams-admin.png`, fullPage: true });
  for (const guard of guards) guard.check();
} catch (error) {
  await page?.screenshot({ path: `${screenshots}/teams-failed.png`, fullPage: true });
  console.error(`step failed: ${error.message}\nseen so far: ${JSON.stringify(seen)}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
