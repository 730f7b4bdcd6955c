// The Tokens page: make a token (its secret shown once), list and revoke one's own; admins also
// everyone's.
import { api, el, ago, agoEl, showErrors } from './common.js';

const form = document.getElementById('new-token');
const admin = document.body.dataset.admin === 'true';

function row(token, withUser) {
  const revoke = el('button', {
    type: 'button',
    class: 'secondary',
    'aria-label': `Revoke ${token.name}${withUser ? ` of ${token.user}` : ''}`,
    onclick: async () => {
      if (!confirm(`Revoke the token "${token.name}"${withUser ? ` of ${token.user}` : ''}? What uses it stops working.`)) return;
      const { status, body } = await api('DELETE', `api/tokens/${encodeURIComponent(token.id)}`);
      if (status !== 204) document.getElementById('token-error').textContent = body?.error || `revoking failed (${status})`;
      load();
    },
  }, 'Revoke');
  return el('tr', { 'data-id': token.id },
    ...(withUser ? [el('td', {}, token.user)] : []),
    el('td', {}, token.name),
    agoEl('td', token.created),
    el('td', { title: token.expires }, new Date(token.expires).toLocaleDateString()),
    token.lastUsed ? agoEl('td', token.lastUsed) : el('td', {}, 'not since the server started'),
    el('td', {}, revoke));
}

async function load() {
  const { status, body } = await api('GET', 'api/tokens');
  if (status !== 200) {
    document.getElementById('token-error').textContent = body?.error || `listing tokens failed (${status})`;
    form.querySelector('button[type=submit]').disabled = true;
    return;
  }
  document.querySelector('#tokens tbody').replaceChildren(...body.map((t) => row(t, false)));
  document.getElementById('no-tokens').hidden = body.length > 0;
  if (admin) {
    const all = await api('GET', 'api/admin/tokens');
    if (all.status === 200) document.querySelector('#all-tokens tbody').replaceChildren(...all.body.map((t) => row(t, true)));
  }
}

form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const { status, body } = await api('POST', 'api/tokens', { name: form.name.value, expiresIn: form.expiresIn.value });
  if (status !== 201) {
    showErrors(form, body, document.getElementById('token-error'));
    return;
  }
  for (const slot of form.querySelectorAll('[data-error-for]')) slot.textContent = '';
  for (const input of form.querySelectorAll('[aria-invalid]')) input.removeAttribute('aria-invalid');
  document.getElementById('token-error').textContent = '';
  document.getElementById('made-token-value').textContent = body.token;
  document.getElementById('made-token').hidden = false;
  form.reset();
  load();
});

document.getElementById('copy-token').addEventListener('click', async () => {
  const token = document.getElementById('made-token-value').textContent;
  try {
    await navigator.clipboard.writeText(token);
    document.getElementById('copy-token').textContent = 'Copied';
  } catch {
    getSelection().selectAllChildren(document.getElementById('made-token-value'));
  }
});

document.getElementById('login-command').textContent = `labforge login ${location.origin}${new URL(document.baseURI).pathname.replace(/\/$/, '')}`;
load();
