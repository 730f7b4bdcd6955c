// A team's server as an attacker with an account meets it: the admin, signed in, opens bob's
// notebook, and a script on bob's page (page.evaluate stands for one bob's server put there)
// plants bob's own valid session beside the admin's, signs the admin out with a form, floods
// notebook sign-in requests, and pushes the admin's cookies out with 200 of its own. After each,
// the web app is asked who the admin's browser is. Prints one JSON line with what it saw.
//   node team-attacks.mjs CONFIG.json
// CONFIG: {url, plantDomains: [...], bobToken, aliceNs, bobNs, admin: [user, password], screenshots, name}
import { readFileSync } from 'node:fs';
import { launch } from './common.mjs';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const url = config.url.replace(/\/$/, '');
const { aliceNs, bobNs, bobToken, plantDomains, screenshots, name } = config;
const seen = {};

// Podman makes a network per notebook: Chromium aborts a navigation under way when the
// machine's interfaces change (other tests starting notebooks), so that one is tried again.
async function go(page, target) {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await page.goto(target);
    } catch (error) {
      if (attempt >= 5 || !String(error.message).includes('ERR_NETWORK_CHANGED')) throw error;
      await page.waitForTimeout(500);
    }
  }
}

const browser = await launch();
try {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 800 } });
  const app = await context.newPage();
  // Signing in is tried again too when a network change cut its request (see go).
  for (let attempt = 1; ; attempt += 1) {
    await go(app, `${url}/login`);
    await app.getByLabel('User name').fill(config.admin[0]);
    await app.getByLabel('Password').fill(config.admin[1]);
    await app.getByRole('button', { name: 'Sign in' }).click();
    try {
      await app.waitForURL(`${url}/`, { timeout: 15_000 });
      break;
    } catch (error) {
      if (attempt >= 3) throw error;
    }
  }
  // Who the web app takes the admin's browser for, asked by its own page.
  const whoami = () => app.evaluate(async () => {
    for (let attempt = 1; ; attempt += 1) {
      try {
        const response = await fetch('api/whoami');
        const body = await response.json().catch(() => null);
        return { status: response.status, name: body?.name ?? null, error: body?.error ?? null };
      } catch (error) {
        // A request cut by a change of the machine's network interfaces (see go) is asked again.
        if (attempt >= 5) throw error;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
  });
  const appCookies = async () => (await context.cookies(url)).map((c) => c.name).sort();
  seen.before = await whoami();
  seen.sessionCookies = (await context.cookies(url)).filter((c) => c.name.includes('session'))
    .map(({ name: n, secure, httpOnly, path, domain }) => ({ name: n, secure, httpOnly, path, domain }));

  const bobs = await context.newPage();
  const bobLoaded = await go(bobs, `${url}/notebook/${bobNs}/bobs/lab`);
  seen.bobsPage = { status: bobLoaded.status(), url: bobs.url() };

  // 1. Bob's own valid session, planted for the web app's host and its parents, on /api and /,
  // under every name a browser might send as the web app's session.
  seen.planted = await bobs.evaluate(({ token, domains }) => {
    for (const domain of domains) {
      for (const path of ['/api', '/']) {
        document.cookie = `labforge_session=${token}; domain=${domain}; path=${path}`;
        document.cookie = `__Host-labforge_session=${token}; domain=${domain}; path=${path}; secure`;
        document.cookie = `__host-labforge_session=${token}; domain=${domain}; path=${path}; secure`;
        document.cookie = `=__Host-labforge_session=${token}; domain=${domain}; path=${path}; secure`;
        // No prefix to a browser, the session's name to a server that trims Unicode spaces.
        document.cookie = `\u2000__Host-labforge_session=${token}; domain=${domain}; path=${path}; secure`;
        document.cookie = `\u00a0__Host-labforge_session=${token}; domain=${domain}; path=${path}; secure`;
        document.cookie = `__Secure-x=1; domain=${domain}; path=${path}; secure`;
      }
    }
    return document.cookie.split('; ').map((c) => c.split('=')[0]);
  }, { token: bobToken, domains: plantDomains });
  seen.appCookiesAfterPlant = await appCookies();
  seen.afterPlant = await whoami();

  // 2. Sign-out by a form on bob's page, sent top-level (its answer seen) and blind from a fetch.
  // Sent again from bob's page reopened when a network change cut it (see go): each is refused.
  let signOut;
  for (let attempt = 1; ; attempt += 1) {
    try {
      [signOut] = await Promise.all([
        bobs.waitForNavigation(),
        bobs.evaluate((action) => {
          const form = document.createElement('form');
          form.method = 'POST';
          form.action = action;
          document.body.append(form);
          form.submit();
        }, `${url}/api/logout`),
      ]);
      break;
    } catch (error) {
      if (attempt >= 5 || !String(error.message).includes('ERR_NETWORK_CHANGED')) throw error;
      await bobs.waitForTimeout(500);
      await go(bobs, `${url}/notebook/${bobNs}/bobs/lab`);
    }
  }
  seen.signOutForm = { status: signOut?.status(), body: (await signOut?.text())?.slice(0, 300) };
  await go(bobs, `${url}/notebook/${bobNs}/bobs/lab`);
  seen.blindSignOut = await bobs.evaluate(async (action) => {
    for (let attempt = 1; ; attempt += 1) {
      try {
        const response = await fetch(action, { method: 'POST', mode: 'no-cors', credentials: 'include' });
        return response.type;
      } catch (error) {
        // A request cut by a change of the machine's network interfaces (see go) is sent again.
        if (attempt >= 5) throw error;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
  }, `${url}/api/logout`);
  seen.afterSignOut = await whoami();

  // 3. Sign-in codes for alice's notebook, asked for as images and fetches, far more than a user
  // may hold; then the admin opens alice's notebook.
  seen.flooded = await bobs.evaluate(async ({ web, ns }) => {
    const hex = () => [...crypto.getRandomValues(new Uint8Array(16))]
      .map((b) => b.toString(16).padStart(2, '0')).join('');
    const link = () => `${web}/notebook-sign-in?namespace=${ns}&name=lab&state=${hex()}`
      + `&return=${encodeURIComponent(`/notebook/${ns}/lab/`)}`;
    const image = () => new Promise((resolve) => {
      const img = new Image();
      img.onload = img.onerror = () => resolve();
      img.src = link();
    });
    const fetched = () => fetch(link(), { mode: 'no-cors', credentials: 'include' }).catch(() => {});
    await Promise.all([...Array(40)].map(image).concat([...Array(40)].map(fetched)));
    return 80;
  }, { web: url, ns: aliceNs });
  const alice = await context.newPage();
  const aliceLoaded = await go(alice, `${url}/notebook/${aliceNs}/lab/lab`);
  seen.aliceAfterFlood = { status: aliceLoaded.status(), url: alice.url(), title: await alice.title() };
  await alice.screenshot({ path: `${screenshots}/team-${name}-alice-after-flood.png` });
  await alice.close();

  // 4. The admin's cookies pushed out by 200 of bob's page's own, then bob's session planted.
  seen.pushedOut = await bobs.evaluate(({ token, domains }) => {
    for (const domain of domains) {
      for (let i = 0; i < 200; i++) document.cookie = `junk${i}=${'x'.repeat(40)}; domain=${domain}; path=/; secure`;
      document.cookie = `labforge_session=${token}; domain=${domain}; path=/`;
    }
    return document.cookie.split('; ').length;
  }, { token: bobToken, domains: plantDomains });
  seen.appCookiesAfterPush = (await appCookies()).filter((n) => !n.startsWith('junk'));
  seen.afterPush = await whoami();
  const reloaded = await go(app, `${url}/`).catch((error) => ({ status: () => error.message.split(' ')[0] }));
  seen.pageAfterPush = reloaded.status();
  // Chromium's own error page (a 431) cannot always be captured.
  await app.screenshot({ path: `${screenshots}/team-${name}-after-attacks.png` }).catch(() => {});
  console.log(JSON.stringify(seen));
} catch (error) {
  console.error(`step failed: ${error.message}\nseen so far: ${JSON.stringify(seen)}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
