import { api } from './common.js';

/** Where sign-in was asked for (a notebook's sign-in): a page of this origin, else home. */
function nextPage() {
  const home = new URL('./', document.baseURI).href;
  const next = new URLSearchParams(location.search).get('next');
  if (!next) return home;
  try {
    const target = new URL(next, location.origin);
    // The whole URL, not its path: a path may itself start with `//`.
    return target.origin === location.origin ? target.href : home;
  } catch {
    return home;
  }
}

const form = document.getElementById('login');
form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const { status, body } = await api('POST', 'api/login', {
    username: form.username.value.trim(),
    password: form.password.value,
  });
  if (status === 200) {
    location.href = nextPage();
  } else {
    document.getElementById('login-error').textContent = body?.error || `sign-in failed (HTTP ${status})`;
  }
});
