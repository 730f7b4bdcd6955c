import { api } from './common.js';

const form = document.getElementById('login');
form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const { status, body } = await api('POST', '/api/login', {
    username: form.username.value.trim(),
    password: form.password.value,
  });
  if (status === 200) {
    // Back to where sign-in was asked for (a notebook's sign-in), never to another site.
    const next = new URLSearchParams(location.search).get('next') || '/';
    location.href = next.startsWith('/') && !next.startsWith('//') && !next.startsWith('/\\') ? next : '/';
  } else {
    document.getElementById('login-error').textContent = body?.error || `sign-in failed (HTTP ${status})`;
  }
});
