// Drives labforge's web UI in headless Debian Chromium as users do, and keeps a screenshot of each
// page. Prints one JSON line with what it saw; exits non-zero when a step fails.
//   node ui.mjs CONFIG.json
// CONFIG: {url, alice: [user, password], bob: [...], admin: [...], agent, screenshots}
import { chromium } from 'playwright-core';
import { readFileSync, renameSync } from 'node:fs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, screenshots } = config;
const seen = {};
const READY = 180_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

async function shot(page, name) {
  await page.screenshot({ path: `${screenshots}/ui-${name}.png`, fullPage: true });
}

async function signIn(context, [user, password]) {
  const page = await context.newPage();
  await page.goto(`${url}/`);
  await page.waitForURL(/\/login$/);
  await page.getByLabel('User name').fill(user);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(`${url}/`);
  return page;
}

// Every request the pages make, so that a failed step can say which ones never finished, failed
// or were refused, and what the pages' scripts complained about.
const network = { pending: new Map(), slow: [], failed: [], refused: [], errors: [] };
function watchNetwork(context) {
  context.on('request', (request) => network.pending.set(request, Date.now()));
  context.on('requestfinished', (request) => {
    const took = Date.now() - network.pending.get(request);
    network.pending.delete(request);
    if (took > 2_000 && request.resourceType() !== 'eventsource') {
      network.slow.push(`${request.method()} ${request.url()}: ${took} ms`);
    }
  });
  context.on('requestfailed', (request) => {
    network.pending.delete(request);
    network.failed.push(`${request.method()} ${request.url()}: ${request.failure()?.errorText}`);
  });
  context.on('response', (response) => {
    if (response.status() >= 400) network.refused.push(`${response.status()} ${response.url()}`);
  });
  context.on('page', (page) => {
    page.on('pageerror', (error) => network.errors.push(`${page.url()}: ${error.message}`));
    page.on('console', (message) => {
      if (message.type() === 'error') network.errors.push(`${page.url()}: ${message.text()}`);
    });
  });
}

function networkReport() {
  const now = Date.now();
  const pending = [...network.pending].map(([r, since]) =>
    `${r.method()} ${r.url()} (${r.resourceType()}, ${Math.round((now - since) / 1000)} s)`);
  const last = (list) => list.slice(-30).join('\n  ');
  return [
    `requests never finished:\n  ${last(pending)}`,
    `requests failed:\n  ${last(network.failed)}`,
    `requests over 2 s:\n  ${last(network.slow)}`,
    `responses >= 400:\n  ${last(network.refused)}`,
    `page errors:\n  ${last(network.errors)}`,
  ].join('\n');
}

function row(page, name) {
  return page.locator(`#notebooks tr[data-name="${name}"]`);
}

try {
  // --- alice ---
  const alice = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  watchNetwork(alice);
  let page = await alice.newPage();
  await page.goto(`${url}/login`);
  await page.getByLabel('User name').fill(config.alice[0]);
  await page.getByLabel('Password').fill('wrong');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#login-error:not(:empty)').waitFor();
  seen.loginError = await page.locator('#login-error').textContent();
  seen.loginPage = await page.locator('main').textContent();
  await shot(page, 'login');
  await page.close();

  page = await signIn(alice, config.alice);
  await page.locator('#empty:not([hidden])').waitFor();
  seen.emptyState = await page.locator('#empty').textContent();
  await shot(page, 'notebooks-empty');

  // The form: a name checked as typed, a server error next to its field, then a good request.
  await page.getByRole('link', { name: 'New notebook' }).first().click();
  await page.waitForURL(`${url}/new`);
  await page.getByLabel('Name', { exact: true }).fill('Bad_Name');
  seen.nameError = await page.locator('[data-error-for="name"]').textContent();
  await page.getByLabel('Name', { exact: true }).fill('lab');
  await page.getByLabel('CPU request').fill('lots');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.locator('[data-error-for="cpu"]:not(:empty)').waitFor();
  seen.cpuError = await page.locator('[data-error-for="cpu"]').textContent();
  await shot(page, 'new-notebook-error');
  await page.getByLabel('CPU request').fill('0.5');
  await page.getByLabel('CPU limit').fill('2');
  await page.getByLabel('Memory limit').fill('2Gi');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.waitForURL(`${url}/`);

  // Ready without reloading: the list follows the event stream.
  const created = Date.now();
  await row(page, 'lab').locator('.state.ready').waitFor({ timeout: READY });
  seen.readyAfterMs = Date.now() - created;
  // Its workspace volume is listed without a reload too, once the start made it.
  await page.locator('#volumes tbody tr', { hasText: 'lab-workspace' }).waitFor({ timeout: 15_000 });
  seen.volumeRow = (await page.locator('#volumes tbody tr', { hasText: 'lab-workspace' }).innerText()).replace(/\s+/g, ' ').trim();
  await shot(page, 'notebooks');

  // Connect: JupyterLab loads through the proxy.
  const [lab] = await Promise.all([
    alice.waitForEvent('page'),
    row(page, 'lab').getByRole('link', { name: 'Connect' }).click(),
  ]);
  // JupyterLab's first load fetches some 10 MB of scripts through the proxy: 4 s here, alone or
  // beside the rest of the suite. On CI it has twice never shown its launcher (the page there,
  // its requests unknown); a stall is recorded with the requests still pending, and the page is
  // reloaded once, as its user would.
  const connected = Date.now();
  try {
    await lab.waitForSelector('.jp-Launcher', { timeout: 90_000 });
  } catch (error) {
    await shot(lab, 'jupyterlab-stalled');
    seen.labStall = `${error.message}\n${networkReport()}`;
    await lab.reload();
    await lab.waitForSelector('.jp-Launcher', { timeout: READY });
  }
  seen.launcherAfterMs = Date.now() - connected;
  seen.labUrl = lab.url();
  seen.jupyterTitle = await lab.title();
  await shot(lab, 'jupyterlab');
  // A cell runs in a kernel whose websocket goes through the notebook's host.
  await lab.locator('.jp-LauncherCard[data-category="Notebook"]').first().click();
  // Run only once the kernel's websocket is up: a cell run before is not sent.
  await lab.locator('#jp-main-statusbar', { hasText: /\| Idle/ })
    .waitFor({ timeout: 90_000 });
  await lab.locator('.jp-Notebook .jp-Cell .cm-content').first().click();
  // The cell also leaves a module in the environment (outside the workspace): the save below
  // then has a file to keep.
  await lab.keyboard.type('import site; open(site.getsitepackages()[0] + "/ui_probe.py", "w").write("A = 1"); print(6 * 7)');
  await lab.keyboard.press('Shift+Enter');
  seen.cellOutput = await lab.locator('.jp-OutputArea-output', { hasText: '42' }).first()
    .textContent({ timeout: 90_000 });
  await shot(lab, 'jupyterlab-cell');
  await lab.close();

  // The notebook page: save the environment and watch the progress reach the digest.
  await page.getByRole('link', { name: 'lab', exact: true }).click();
  await page.waitForURL(/\/notebooks\/.+\/lab$/);
  await page.locator('#state.ready').waitFor({ timeout: READY });
  await page.locator('#events tbody tr').first().waitFor();
  await page.getByLabel('Tag').fill('ui-save');
  await page.getByRole('button', { name: 'Save environment' }).click();
  await page.locator('#save-text', { hasText: 'sha256:' }).waitFor({ timeout: 120_000 });
  seen.saveText = await page.locator('#save-text').textContent();
  seen.saveBar = await page.locator('#save-bar').evaluate((bar) => bar.value);
  await page.locator('#images tbody tr').first().waitFor();
  seen.savedImages = await page.locator('#images tbody tr').count();
  await page.locator('#logs:not(:empty)').waitFor({ timeout: 30_000 });
  await shot(page, 'notebook-saved');
  // Every card fits its page, saved images' actions included, wide and narrower.
  const viewport = page.viewportSize();
  for (const width of [1400, 1024]) {
    await page.setViewportSize({ width, height: 900 });
    seen[`overflowingAt${width}`] = await page.evaluate(() => [...document.querySelectorAll('.card, .table-wrap')]
      .filter((node) => node.scrollWidth > node.clientWidth + 1)
      .map((node) => node.id || node.querySelector('h2, h3')?.textContent || node.className));
  }
  await shot(page, 'notebook-saved-1024');
  await page.setViewportSize(viewport);
  // "Saved 0 s ago" ages while the page stays open.
  const savedWhen = page.locator('#images tbody tr td[data-ago]').first();
  const before = await savedWhen.textContent();
  await page.waitForFunction((text) => document.querySelector('#images tbody tr td[data-ago]').textContent !== text, before, { timeout: 15_000 });
  seen.savedAges = [before, await savedWhen.textContent()];
  // The same tag again is asked about first; declined, nothing is saved.
  page.once('dialog', (dialog) => { seen.tagReuseQuestion = dialog.message(); dialog.dismiss(); });
  await page.getByLabel('Tag').fill('ui-save');
  await page.getByRole('button', { name: 'Save environment' }).click();
  seen.savedAfterDeclined = await page.locator('#images tbody tr').count();

  // A failed save shows its error: the agent is taken away meanwhile.
  renameSync(config.agent, `${config.agent}.away`);
  try {
    await page.getByLabel('Tag').fill('will-fail');
    await page.getByRole('button', { name: 'Save environment' }).click();
    await page.locator('#save-error:not(:empty)').waitFor({ timeout: 60_000 });
    seen.saveError = await page.locator('#save-error').textContent();
    await shot(page, 'notebook-save-failed');
  } finally {
    renameSync(`${config.agent}.away`, config.agent);
  }

  // Start a new notebook from the saved image.
  await page.getByRole('link', { name: 'Start a new notebook from it' }).first().click();
  await page.waitForURL(/\/new\?image=/);
  seen.prefilledImage = await page.getByLabel(/Custom image/).inputValue();
  // Offered for the server it was saved from only.
  const values = (select) => page.locator(`${select} option`).evaluateAll((o) => o.map((x) => x.value));
  seen.savedOffered = { jupyter: await values('#image-jupyter'), vscode: await values('#image-vscode') };
  // An existing workspace is picked from the namespace's own volumes.
  await page.locator('input[name=workspace][value=existing]').check();
  seen.existingNameShown = await page.locator('#workspaceName').isVisible();
  await page.locator('#workspace-volumes option').first().waitFor({ state: 'attached' });
  seen.existingVolumes = await page.locator('#workspace-volumes option')
    .evaluateAll((options) => options.map((option) => option.value));
  await page.locator('input[name=workspace][value=new]').check();
  // A data volume row shows where it can be filled in, and goes again.
  await page.locator('#add-volume').click();
  seen.dataVolumeShown = await page.locator('#volumes .volume .vol-name').first().isVisible();
  await page.locator('#volumes .volume').getByRole('button', { name: 'Remove' }).click();
  await page.getByLabel('Name', { exact: true }).fill('from-saved');
  await page.getByLabel('CPU limit').fill('2');
  await page.getByLabel('Memory limit').fill('2Gi');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.waitForURL(`${url}/`);
  await row(page, 'from-saved').locator('.state.ready').waitFor({ timeout: READY });
  seen.fromSavedImage = await row(page, 'from-saved').locator('td').nth(3).textContent();

  // Saved at once: nothing changed since its image, so it says so and no image is made.
  await page.getByRole('link', { name: 'from-saved', exact: true }).click();
  await page.waitForURL(/\/notebooks\/.+\/from-saved$/);
  await page.locator('#state.ready').waitFor({ timeout: READY });
  await page.getByLabel('Tag').fill('nothing-new');
  await page.getByRole('button', { name: 'Save environment' }).click();
  await page.locator('#save-text', { hasText: 'Nothing changed' }).waitFor({ timeout: 120_000 });
  seen.unchangedSave = {
    text: await page.locator('#save-text').textContent(),
    bar: await page.locator('#save-bar').evaluate((bar) => bar.value),
    buttonEnabled: await page.getByRole('button', { name: 'Save environment' }).isEnabled(),
  };

  // Saved images are deleted where they were saved: one a notebook runs on is refused, saying
  // which; another goes, from the list and the registry, after a question naming it.
  await page.goto(`${url}/notebooks/${config.alice[0]}/lab`);
  await page.locator('#state.ready').waitFor({ timeout: READY });
  await page.getByLabel('Tag').fill('spare');
  await page.getByRole('button', { name: 'Save environment' }).click();
  await page.locator('#save-text', { hasText: ':spare @ sha256:' }).waitFor({ timeout: 120_000 });
  const imageRow = (tag) => page.locator('#images tbody tr', { hasText: `:${tag}` });
  await imageRow('spare').waitFor();
  const dialogs = [];
  page.on('dialog', (dialog) => { dialogs.push(dialog.message()); dialog.accept(); });
  await imageRow('ui-save').getByRole('button', { name: 'Delete' }).click();
  for (let i = 0; i < 100 && dialogs.length < 2; i += 1) await page.waitForTimeout(100);
  await imageRow('spare').getByRole('button', { name: 'Delete' }).click();
  await imageRow('spare').waitFor({ state: 'detached', timeout: 30_000 });
  page.removeAllListeners('dialog');
  seen.imageDeletion = { dialogs, rowsLeft: await page.locator('#images tbody tr').count() };
  // The one left is shared with bob's namespace: asked for by name, shown on its row.
  page.once('dialog', (dialog) => { seen.shareQuestion = dialog.message(); dialog.accept(config.bob[0]); });
  await imageRow('ui-save').getByRole('button', { name: 'Share…' }).click();
  await imageRow('ui-save').locator('.muted', { hasText: `Shared with ${config.bob[0]}` }).waitFor();
  seen.sharedRow = await imageRow('ui-save').locator('.muted', { hasText: 'Shared with' }).textContent();
  await page.goto(`${url}/`);

  // A narrow window still reads.
  await page.setViewportSize({ width: 420, height: 860 });
  await shot(page, 'notebooks-narrow');
  await alice.close();

  // A link to the notebook, opened signed out, signs in saying which notebook it opens.
  const stranger = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const strangerPage = await stranger.newPage();
  await strangerPage.goto(`${url}/notebook/${config.alice[0]}/lab/lab`);
  await strangerPage.locator('#signing-in-to').waitFor({ timeout: 15_000 });
  seen.signingInTo = await strangerPage.locator('#signing-in-to').innerText();
  await shot(strangerPage, 'sign-in-for-notebook');
  await stranger.close();

  // --- bob: sees nothing of alice's, cannot open it ---
  const bob = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  watchNetwork(bob);
  page = await signIn(bob, config.bob);
  await page.locator('#empty:not([hidden])').waitFor();
  seen.bobRows = await page.locator('#notebooks tbody tr').count();
  const aliceNs = config.alice[0];
  const forbidden = await page.goto(`${url}/notebooks/${aliceNs}/lab`);
  seen.bobNotebookPage = forbidden.status();
  await shot(page, 'forbidden');
  const proxied = await page.goto(`${url}/notebook/${aliceNs}/lab/lab`);
  seen.bobProxy = proxied.status();
  await page.goto(`${url}/new`);
  seen.sharedOffered = await page.locator('#image-jupyter optgroup[label="Shared with you"] option')
    .evaluateAll((options) => options.map((option) => option.value));
  await page.getByLabel('Name', { exact: true }).fill('bobs');
  await page.getByLabel('CPU limit').fill('0.5');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.waitForURL(`${url}/`);
  await row(page, 'bobs').locator('.state.ready').waitFor({ timeout: READY });
  await bob.close();

  // --- admin: everyone's notebooks, a filter, bulk stop ---
  const admin = await browser.newContext({ viewport: { width: 1400, height: 860 } });
  watchNetwork(admin);
  page = await signIn(admin, config.admin);

  // The admin opens alice's notebook, then bob's. A script on bob's page (page.evaluate stands for
  // one bob's server put there) tries to act as the admin on the web app and on alice's notebook.
  const aliceLab = await admin.newPage();
  const aliceLoaded = await aliceLab.goto(`${url}/notebook/${aliceNs}/lab/lab`);
  seen.adminOnAlice = { status: aliceLoaded.status(), url: aliceLab.url() };
  await aliceLab.close();
  const bobNs = config.bob[0];
  const bobsPage = await admin.newPage();
  const bobLoaded = await bobsPage.goto(`${url}/notebook/${bobNs}/bobs/lab`);
  seen.adminOnBob = { status: bobLoaded.status(), url: bobsPage.url() };
  const aliceOrigin = new URL(seen.adminOnAlice.url).origin;
  seen.attack = await bobsPage.evaluate(async ({ web, alice, aliceNs, bobNs }) => {
    const attempt = async (what) => {
      try {
        const response = await what();
        return response.type === 'opaque' ? 'opaque' : `HTTP ${response.status}`;
      } catch (error) {
        return `refused: ${error.message}`;
      }
    };
    const json = { 'content-type': 'application/json' };
    return {
      apiRead: await attempt(() => fetch(`${web}/api/admin/notebooks`, { credentials: 'include' })),
      apiWrite: await attempt(() => fetch(`${web}/api/namespaces/${bobNs}/notebooks`, {
        method: 'POST', credentials: 'include', headers: json, body: '{"name":"pwned"}',
      })),
      apiBlindWrite: await attempt(() => fetch(`${web}/api/namespaces/${bobNs}/notebooks`, {
        method: 'POST', mode: 'no-cors', credentials: 'include', body: '{"name":"pwned-blind"}',
      })),
      aliceRead: await attempt(() => fetch(`${alice}/notebook/${aliceNs}/lab/api/contents`, {
        credentials: 'include',
      })),
      aliceBlindWrite: await attempt(() => fetch(`${alice}/notebook/${aliceNs}/lab/api/contents`, {
        method: 'POST', mode: 'no-cors', credentials: 'include', body: '{"type":"file","ext":".txt"}',
      })),
      aliceSocket: await new Promise((resolve) => {
        const socket = new WebSocket(
          `${alice.replace('http', 'ws')}/notebook/${aliceNs}/lab/api/events/subscribe`);
        socket.onopen = () => { socket.close(); resolve('opened'); };
        socket.onerror = () => resolve('refused');
      }),
    };
  }, { web: url, alice: aliceOrigin, aliceNs, bobNs });
  await bobsPage.close();
  const stillSignedIn = await page.goto(`${url}/admin`);
  seen.adminAfterAttack = stillSignedIn.status();

  await page.goto(`${url}/`);
  await page.getByRole('link', { name: 'Admin' }).click();
  await page.waitForURL(`${url}/admin`);
  await page.locator('#all tbody tr').nth(2).waitFor();
  seen.adminOwners = [...new Set(await page.locator('#all tbody tr td:nth-child(4)').allTextContents())].sort();
  seen.adminTotals = await page.locator('#totals').textContent();
  await shot(page, 'admin');
  // Part of a name, in another case, finds its owner.
  await page.getByLabel('User', { exact: true }).fill(config.bob[0].replace(/^ui-/, '').slice(0, 5).toUpperCase());
  await page.waitForFunction(() => document.querySelectorAll('#all tbody tr').length === 1);
  await page.getByLabel('Select all').check();
  page.once('dialog', (dialog) => dialog.accept());
  await page.getByRole('button', { name: 'Stop selected' }).click();
  await page.locator('#all tbody tr .state.stopped').waitFor({ timeout: 30_000 });
  seen.bulkStopped = true;
  seen.ticksAfterBulkStop = await page.locator('#all input[type=checkbox]:checked, #select-all:checked').count();
  await shot(page, 'admin-filtered');
  // The audit trail names who stopped bob's notebook, newest first.
  await page.getByLabel('Who', { exact: true }).fill(config.admin[0]);
  const stopRow = page.locator('#audit tbody tr', { hasText: `PATCH /api/namespaces/${config.bob[0]}/notebooks/` }).first();
  await stopRow.waitFor({ timeout: 15_000 });
  seen.auditStop = (await stopRow.innerText()).replace(/\s+/g, ' ').trim();
  await shot(page, 'admin-audit');
  await admin.close();

  seen.slowRequests = network.slow;
  // What labforge's own pages asked for and did not get (JupyterLab's pages are not its own).
  seen.missing = [...network.refused, ...network.errors]
    .filter((line) => /^404 |status of 404/.test(line) && !line.includes('/notebook/'));
  // Script errors of labforge's own pages fail the run ("Failed to load resource" lines are the
  // refused requests above, which the steps check).
  const scriptErrors = network.errors
    .filter((line) => !line.includes('/notebook/') && !line.includes('Failed to load resource'));
  if (scriptErrors.length) throw new Error(`errors on labforge's pages:\n  ${scriptErrors.join('\n  ')}`);
  console.log(JSON.stringify(seen));
} catch (error) {
  console.error(`step failed: ${error.message}\nseen so far: ${JSON.stringify(seen)}`);
  console.error(networkReport());
  // What each open page showed when the step failed, for whoever reads the failure.
  let n = 0;
  for (const context of browser.contexts()) {
    for (const open of context.pages()) {
      const path = `${screenshots}/ui-failed-${n++}.png`;
      await open.screenshot({ path, fullPage: true })
        .then(() => console.error(`page ${open.url()} at failure: ${path}`))
        .catch(() => {});
    }
  }
  process.exitCode = 1;
} finally {
  await browser.close();
}
