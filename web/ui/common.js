// Shared by every page: the API client, small DOM helpers, the user menu.

/** Calls the JSON API; resolves to {status, body} (body is parsed JSON, or text). */
export async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401 && !location.pathname.startsWith('/login')) {
    location.href = '/login';
  }
  const text = await response.text();
  let parsed = text;
  try { parsed = text ? JSON.parse(text) : null; } catch { /* text answer */ }
  return { status: response.status, body: parsed };
}

/** Creates an element: el('td', {class: 'x'}, 'text', child...). */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === false || value === null || value === undefined) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function stateBadge(state, reason) {
  return el('span', { class: `state ${state}`, title: reason || state }, state);
}

/** "3 min ago" for an RFC 3339 time; "never" when absent. */
export function ago(time) {
  if (!time) return 'never';
  const seconds = Math.max(0, (Date.now() - Date.parse(time)) / 1000);
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return new Date(time).toLocaleString();
}

export function bytes(n) {
  if (!n) return '0 B';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
  return `${(n / 1024 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function gpuText(gpus) {
  return gpus ? `${gpus.count} × ${gpus.vendor}` : '—';
}

/** Shows an API error next to the field it names, or in `fallback`. */
export function showErrors(form, answer, fallback) {
  for (const node of form.querySelectorAll('[data-error-for]')) node.textContent = '';
  for (const node of form.querySelectorAll('[aria-invalid]')) node.removeAttribute('aria-invalid');
  if (fallback) fallback.textContent = '';
  const message = answer?.error || String(answer || 'request failed');
  const field = answer?.field;
  const slot = field && (form.querySelector(`[data-error-for="${CSS.escape(field)}"]`)
    || form.querySelector(`[data-error-for="${CSS.escape(field.split(/[.[]/)[0])}"]`));
  if (slot) {
    slot.textContent = message;
    const input = slot.parentElement.querySelector('input, select');
    if (input) { input.setAttribute('aria-invalid', 'true'); input.focus(); }
  } else if (fallback) {
    fallback.textContent = message;
  }
}

document.getElementById('logout')?.addEventListener('click', async () => {
  await api('POST', '/api/logout');
  location.href = '/login';
});

/** Where a notebook opens: its own host when it has one (same scheme and port as this page). */
export function notebookUrl(nb) {
  if (!nb.host) return nb.url;
  return `${location.protocol}//${nb.host}${location.port ? `:${location.port}` : ''}${nb.url}`;
}
