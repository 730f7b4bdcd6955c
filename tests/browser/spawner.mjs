// The spawner form's every path: what is shown for each server type and workspace kind, every
// wrong field at once under its own input, an image its registry lacks refused under the image
// box, and notebooks created with no workspace and with an
// existing one; then the pages around a notebook's URL: a stopped one's (state, Start) and the
// proxy's 403 for another user; last, a kept volume deleted once no notebook mounts it. Prints one JSON line with what it saw; exits non-zero when a step
// fails or a page logs an error.
//   node spawner.mjs CONFIG.json
// CONFIG: {url, user: [name, password], other: [name, password], keptVolume, missingImage,
//          screenshots}
import { readFileSync } from 'node:fs';
import { launch, signedIn } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url, screenshots } = config;
const seen = {};
const browser = await launch();
try {
  const { guard, page } = await signedIn(browser, url, config.user);
  await page.goto(`${url}/new`);
  const visible = (selector) => page.locator(selector).isVisible();
  const shown = async () => ({
    size: await visible('#workspaceSize'),
    sizeLabel: await visible('label[for=workspaceSize]'),
    volume: await visible('#workspaceName'),
    volumeLabel: await visible('label[for=workspaceName]'),
    jupyterImages: await visible('#image-jupyter'),
    vscodeImages: await visible('#image-vscode'),
    vscodeLabel: await visible('label[for=image-vscode]'),
  });
  seen.initially = await shown();
  await page.getByLabel('Existing', { exact: true }).check();
  seen.existing = await shown();
  await page.getByLabel('None', { exact: true }).check();
  seen.none = await shown();
  await page.getByLabel('VSCode').check();
  seen.vscode = await shown();
  await page.getByLabel('JupyterLab').check();
  await page.getByLabel('New', { exact: true }).check();

  // Five wrong fields: all told at once, each under its input and tied to it.
  await page.getByLabel('Name', { exact: true }).fill('lab');
  await page.getByLabel('CPU request').fill('lots');
  await page.getByLabel('Memory request').fill('4');
  await page.getByLabel('Size', { exact: true }).fill('9Pi');
  await page.getByRole('button', { name: 'Add a variable' }).click();
  await page.locator('.env .env-name').fill('1BAD');
  await page.getByRole('button', { name: 'Add a data volume' }).click();
  await page.locator('.volume .vol-path').fill('relative');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.locator('[data-error-for="cpu"]:not(:empty)').waitFor();
  seen.errors = await page.evaluate(() => [...document.querySelectorAll('[data-error-for]')]
    .filter((slot) => slot.textContent)
    .map((slot) => {
      const described = [...document.querySelectorAll('[aria-describedby]')]
        .find((input) => input.getAttribute('aria-describedby').split(' ').includes(slot.id));
      return {
        field: slot.dataset.errorFor,
        message: slot.textContent,
        input: described?.id ?? null,
        invalid: described?.getAttribute('aria-invalid') ?? null,
        visible: slot.offsetParent !== null,
      };
    }));
  seen.focused = await page.evaluate(() => document.activeElement?.id);
  seen.formError = await page.locator('#form-error').textContent();
  seen.kept = await page.getByLabel('CPU request').inputValue();
  await page.screenshot({ path: `${screenshots}/spawner-errors.png`, fullPage: true });

  // An image its registry does not have: told under the image box before anything is made.
  await page.getByRole('button', { name: 'Remove' }).first().click();
  await page.getByRole('button', { name: 'Remove' }).first().click();
  await page.getByLabel('CPU request').fill('0.5');
  await page.getByLabel('Memory request').fill('1Gi');
  await page.getByLabel('None', { exact: true }).check();
  await page.getByLabel('Name', { exact: true }).fill('ghost');
  await page.getByLabel(/Custom image/).fill(config.missingImage);
  await page.getByRole('button', { name: 'Create notebook' }).click();
  const imageError = page.locator('[data-error-for="image"]:not(:empty)');
  await imageError.waitFor();
  seen.missingImage = {
    message: await imageError.textContent(),
    visible: await imageError.isVisible(),
    focused: await page.evaluate(() => document.activeElement?.id),
    url: page.url(),
  };
  await page.getByLabel(/Custom image/).fill('');

  // No workspace at all.
  await page.getByLabel('Name', { exact: true }).fill('bare');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.waitForURL(`${url}/`);

  // An existing volume: a name the namespace lacks is refused under the volume box, one it has
  // (offered in the box's list) is mounted.
  await page.goto(`${url}/new`);
  await page.getByLabel('Name', { exact: true }).fill('again');
  await page.getByLabel('Existing', { exact: true }).check();
  await page.getByLabel('Existing volume name').fill('no-such-volume');
  await page.getByRole('button', { name: 'Create notebook' }).click();
  const volumeError = page.locator('[data-error-for="workspace.name"]:not(:empty)');
  await volumeError.waitFor();
  seen.missingVolume = { message: await volumeError.textContent(), visible: await volumeError.isVisible() };
  seen.offeredVolumes = await page.locator('#workspace-volumes option')
    .evaluateAll((options) => options.map((o) => o.value));
  await page.getByLabel('Existing volume name').fill(config.keptVolume);
  await page.getByRole('button', { name: 'Create notebook' }).click();
  await page.waitForURL(`${url}/`);

  // The list on a phone and on a wide screen: nothing off screen, image names break at their
  // separators.
  await page.locator('#notebooks tr[data-name="again"]').waitFor();
  await page.setViewportSize({ width: 420, height: 800 });
  await page.screenshot({ path: `${screenshots}/notebooks-420.png`, fullPage: true });
  seen.narrow = await page.evaluate(() => ({
    pageWidth: document.documentElement.scrollWidth,
    actionsRight: Math.max(...[...document.querySelectorAll('#notebooks td:last-child button')]
      .map((b) => b.getBoundingClientRect().right)),
  }));
  await page.setViewportSize({ width: 1400, height: 900 });
  await page.screenshot({ path: `${screenshots}/notebooks-1400.png`, fullPage: true });
  seen.imageBreaks = await page.locator('#notebooks td.wrap wbr').count();
  await page.setViewportSize({ width: 1280, height: 900 });

  // A stopped notebook's URL: its page, with why and Start.
  const bare = page.locator('#notebooks tr[data-name="bare"]');
  await bare.locator('.state.ready').waitFor({ timeout: 120_000 });
  await bare.getByRole('button', { name: 'Stop' }).click();
  await bare.locator('.state.stopped').waitFor({ timeout: 60_000 });
  const ns = config.user[0];
  await page.goto(`${url}/notebook/${ns}/bare/lab`);
  await page.waitForURL(`${url}/notebooks/${ns}/bare`);
  await page.locator('#state.stopped').waitFor();
  seen.stoppedPage = {
    reason: await page.locator('#reason').textContent(),
    start: await page.getByRole('button', { name: 'Start' }).isVisible(),
    connect: await page.getByRole('link', { name: 'Connect' }).isVisible(),
  };
  await page.screenshot({ path: `${screenshots}/notebook-stopped.png`, fullPage: true });
  seen.startedAt = new Date().toISOString();
  await page.getByRole('button', { name: 'Start' }).click();
  await page.locator('#state.ready').waitFor({ timeout: 120_000 });
  const detail = (term) => page.locator(`#details dt:text-is("${term}") + dd`).textContent();
  seen.details = { created: await detail('Created'), activityAfterStart: await detail('Last activity') };

  // Another user at this notebook's URL: a 403 in the app's look, with a way back.
  const { guard: otherGuard, page: visitor } = await signedIn(browser, url, config.other);
  const refused = await visitor.goto(`${url}/notebook/${ns}/bare/lab`);
  seen.forbidden = {
    status: refused.status(),
    heading: await visitor.locator('h1').textContent(),
    styled: await visitor.locator('header').evaluate((h) => getComputedStyle(h).backgroundColor),
  };
  await visitor.screenshot({ path: `${screenshots}/notebook-forbidden.png`, fullPage: true });
  await visitor.getByRole('link', { name: 'Back to your notebooks' }).click();
  await visitor.waitForURL(`${url}/`);

  // Stopped again: the last activity is still shown.
  await page.getByRole('button', { name: 'Stop' }).click();
  await page.locator('#state.stopped').waitFor({ timeout: 60_000 });
  seen.details.activityAfterStop = await detail('Last activity');

  // Volumes: the kept workspace is listed as mounted by the notebook that took it over, with no
  // way to delete it; once that notebook is deleted it can be, after a question naming what is
  // lost.
  await page.goto(`${url}/`);
  const volumeRow = page.locator(`#volumes tbody tr[data-name="${config.keptVolume}"]`);
  await volumeRow.waitFor();
  seen.volumeMountedBy = await volumeRow.locator('td').nth(1).textContent();
  seen.volumeDeletableWhileMounted = await volumeRow.getByRole('button', { name: 'Delete' }).count();
  const questions = [];
  page.on('dialog', (dialog) => { questions.push(dialog.message()); dialog.accept(); });
  const again = page.locator('#notebooks tr[data-name="again"]');
  await again.getByRole('button', { name: 'Delete' }).click();
  await again.waitFor({ state: 'detached', timeout: 60_000 });
  await volumeRow.getByRole('button', { name: 'Delete' }).click();
  await volumeRow.waitFor({ state: 'detached', timeout: 30_000 });
  page.removeAllListeners('dialog');
  seen.volumeQuestions = questions;

  guard.check();
  otherGuard.check();
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
