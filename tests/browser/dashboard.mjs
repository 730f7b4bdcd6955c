// labforge's pages under /jupyter/ inside the central dashboard's iframe (dashboard.html): they
// follow the dashboard's namespace selector, a notebook is created in the selected namespace
// through the form, and every request the pages make stays under /jupyter/. Prints one JSON
// line with what it saw; exits non-zero when a step fails or a page logs an error.
//   node dashboard.mjs CONFIG.json
// CONFIG: {url, user, namespace, own}: the user (as the auth proxy's kubeflow-userid header),
// the namespace the dashboard selects first, and the user's own.
import { readFileSync } from 'node:fs';
import { launch, pageErrors } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const { url } = config;
const seen = { outside: [] };
const browser = await launch();
try {
  // The auth proxy in front of the cluster's gateway sets who the user is.
  const context = await browser.newContext({
    viewport: { width: 1280, height: 900 },
    extraHTTPHeaders: { 'kubeflow-userid': config.user },
  });
  const guard = pageErrors(context);
  context.on('request', (request) => {
    const { origin, pathname } = new URL(request.url());
    if (origin === url && pathname !== '/' && !pathname.startsWith('/jupyter/')) {
      seen.outside.push(pathname);
    }
  });
  const page = await context.newPage();
  await page.goto(`${url}/`);
  const app = page.frameLocator('#app');
  // The dashboard's first namespace, taken from its message.
  await app.getByRole('heading', { name: `Notebooks in ${config.namespace}` }).waitFor();
  await app.locator('#notebooks tr[data-name="shared"]').waitFor();
  seen.listed = await app.locator('#notebooks tbody tr').count();

  // The form keeps the namespace; the notebook is made there.
  await app.getByRole('link', { name: 'New notebook' }).first().click();
  await app.getByRole('heading', { name: 'New notebook' }).waitFor();
  await app.getByLabel('Name', { exact: true }).fill('from-dashboard');
  await app.getByLabel('None', { exact: true }).check();
  await app.getByRole('button', { name: 'Create notebook' }).click();
  await app.locator('#notebooks tr[data-name="from-dashboard"]').waitFor();
  seen.created = 'from-dashboard';
  const frameUrl = new URL(page.frames().find((f) => f.parentFrame())?.url());
  seen.afterCreate = `${frameUrl.pathname}${frameUrl.search}`;

  // The selector changes: the app follows.
  await page.getByLabel('Namespace').selectOption(config.own);
  await app.getByRole('heading', { name: `Notebooks in ${config.own}` }).waitFor();
  seen.connections = await page.evaluate(() => window.connections);

  guard.check();
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
