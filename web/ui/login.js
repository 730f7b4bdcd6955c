import { api } from './common.js';

const form = document.getElementById('login');
form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const { status, body } = await api('POST', '/api/login', {
    username: form.username.value.trim(),
    password: form.password.value,
  });
  if (status === 200) {
    location.href = '/';
  } else {
    document.getElementById('login-error').textContent = body?.error || `sign-in failed (HTTP ${status})`;
  }
});
