// Shared by every page: the API client, small DOM helpers, the user menu, the central dashboard's
// namespace selector. Every path is relative to the page's <base href>, the app's base path.

/** Calls the JSON API; resolves to {status, body} (body is parsed JSON, or text). */
export async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401 && !document.getElementById('login')) {
    location.href = 'login';
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

/** `text` with line-break opportunities after each / : and @, for image references. */
export function breakable(text) {
  const parts = String(text ?? '').split(/(?<=[/:@])/);
  return parts.flatMap((part, i) => (i ? [document.createElement('wbr'), part] : [part]));
}

export function stateBadge(state, reason) {
  return el('span', { class: `state ${state}`, title: reason || state }, state);
}

/** A list's state cell: the badge, and for a notebook not ready yet why (its place in line, a
 * pull, a restart) beneath it. */
export function stateCell(nb) {
  return el('td', { class: 'wrap' }, stateBadge(nb.state, nb.reason),
    nb.state === 'starting' && nb.reason ? el('span', { class: 'state-reason' }, breakable(nb.reason)) : null);
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

/**
 * A `tag` element saying how long ago `time` was, kept current: every such element of the page
 * is said again every 5 s.
 */
export function agoEl(tag, time, attributes = {}) {
  return el(tag, { ...attributes, title: time || '', 'data-ago': time || '' }, ago(time));
}

setInterval(() => {
  for (const node of document.querySelectorAll('[data-ago]')) {
    node.textContent = ago(node.dataset.ago);
  }
}, 5000);

export function bytes(n) {
  if (!n) return '0 B';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
  return `${(n / 1024 ** i).toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** A Kubernetes quantity ("500m", "2", "1Gi") as a number; 0 when it is not one. */
export function quantity(text) {
  const m = /^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$/.exec(text || '');
  if (!m) return 0;
  const unit = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 }[m[2]] || 1;
  return Number(m[1]) * unit;
}

/** CPU in use against the limit, with a bar; what was asked for while it is not measured. */
export function cpuUse(nb) {
  const asked = nb.cpuLimit || nb.cpu;
  const used = nb.usage?.cpuCores;
  if (used === undefined || used === null) return asked;
  const limit = quantity(asked);
  return el('span', { class: 'use', 'data-cpu-cores': used, title: `${used.toFixed(2)} cores in use of ${asked}` },
    limit ? el('meter', { min: 0, max: limit, value: Math.min(used, limit), 'aria-label': 'CPU in use' }) : null,
    `${used.toFixed(2)} / ${asked}`);
}

/** Memory in use against the limit, with a bar, marked near the limit; what was asked for while
 * it is not measured. */
export function memoryUse(nb) {
  const usage = nb.usage;
  if (!usage) return nb.memoryLimit || nb.memory;
  const limit = usage.memoryLimitBytes;
  return el('span', {
    class: usage.memoryNearLimit ? 'use near-limit' : 'use',
    'data-memory-bytes': usage.memoryBytes,
    title: `${bytes(usage.memoryBytes)} in use${limit ? ` of ${bytes(limit)}` : ''}`,
  },
  limit ? el('meter', { min: 0, max: limit, high: limit * 0.9, optimum: 0, value: usage.memoryBytes, 'aria-label': 'Memory in use' }) : null,
  `${bytes(usage.memoryBytes)}${limit ? ` / ${bytes(limit)}` : ''}`,
  usage.memoryNearLimit ? el('strong', { class: 'near-limit-note' }, 'near its memory limit: the kernel may be stopped') : null);
}

export function gpuText(gpus) {
  return gpus?.count ? `${gpus.count} × ${gpus.vendor}` : '—';
}

/** The IDE a notebook serves, by its Kubeflow server type. */
export function serverName(serverType) {
  return { 'group-one': 'VSCode', 'group-two': 'RStudio' }[serverType] || 'JupyterLab';
}

/** The GPUs a notebook holds and, while it runs, what they do: use where their vendor reports
 * it, "use unknown" where not. */
export function gpuUse(nb) {
  if (!nb.gpus?.count) return '—';
  const held = gpuText(nb.gpus);
  if (!nb.usage) return held;
  const gpu = nb.usage.gpu;
  return el('span', { class: 'use', 'data-gpu-utilization': gpu ? gpu.utilizationPercent : null },
    held, gpu ? ` · ${gpu.utilizationPercent.toFixed(0)} % · ${bytes(gpu.memoryBytes)}` : ' · use unknown');
}

/** The input an error slot is about: named by its data-input, else the one just before it. */
function inputOf(form, slot) {
  if (slot.dataset.input) return form.querySelector(`#${CSS.escape(slot.dataset.input)}`);
  const before = slot.previousElementSibling;
  return before && before.matches('input, select') ? before : null;
}

function slotOf(form, field) {
  return form.querySelector(`[data-error-for="${CSS.escape(field)}"]`)
    || form.querySelector(`[data-error-for="${CSS.escape(field.split(/[.[]/)[0])}"]`);
}

/**
 * Shows an API error answer in a form: every wrong field's message under that field, tied to its
 * input for screen readers (aria-describedby) and marked invalid; what no field shows goes to
 * `fallback`. Focuses the first wrong input. What the user typed stays.
 */
export function showErrors(form, answer, fallback) {
  for (const node of form.querySelectorAll('[data-error-for]')) node.textContent = '';
  for (const node of form.querySelectorAll('[aria-invalid]')) node.removeAttribute('aria-invalid');
  if (fallback) fallback.textContent = '';
  const errors = answer?.errors?.length ? answer.errors
    : [{ field: answer?.field, message: answer?.error || String(answer || 'request failed') }];
  const unplaced = [];
  let first = null;
  for (const { field, message } of errors) {
    const slot = field && slotOf(form, field);
    if (!slot || slot.textContent) {
      unplaced.push(field ? `${field}: ${message}` : message);
      continue;
    }
    slot.textContent = message;
    const input = inputOf(form, slot);
    if (!input) continue;
    slot.id ||= `error-${(input.id || field).replace(/[^A-Za-z0-9_-]/g, '-')}`;
    const described = (input.getAttribute('aria-describedby') || '').split(' ').filter(Boolean);
    if (!described.includes(slot.id)) input.setAttribute('aria-describedby', [...described, slot.id].join(' '));
    input.setAttribute('aria-invalid', 'true');
    // The first in the page, whatever order the server named them in.
    if (!first || (first.compareDocumentPosition(input) & Node.DOCUMENT_POSITION_PRECEDING)) first = input;
  }
  if (fallback) fallback.textContent = unplaced.join(' · ');
  first?.focus();
}

document.getElementById('logout')?.addEventListener('click', async () => {
  await api('POST', 'api/logout');
  location.href = 'login';
});

/** Where a notebook opens: its own host when it has one (same scheme and port as this page). */
export function notebookUrl(nb) {
  if (!nb.host) return nb.url;
  return `${location.protocol}//${nb.host}${location.port ? `:${location.port}` : ''}${nb.url}`;
}

/** A link to a page of the app (`path` relative to the base) that keeps namespace `ns` chosen
 * when it is not the user's own. */
export function pageLink(path, ns, params = {}) {
  const query = new URLSearchParams(params);
  if (ns && ns !== document.body.dataset.ownNamespace) query.set('ns', ns);
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/**
 * Inside Kubeflow's central dashboard (a parent frame of this origin): the dashboard answers
 * `iframe-connected` with its namespace selector's value, and sends it again on every change.
 * The list and the form follow it. Other pages (a notebook's, the admin's, an error) stay: the
 * dashboard sends its namespace on every load, and following it there would leave the page, or
 * loop on a namespace the user may not open.
 */
function followDashboardNamespace() {
  if (window.parent === window || !document.body.dataset.namespace) return;
  window.addEventListener('message', (event) => {
    if (event.origin !== location.origin || event.source !== window.parent) return;
    const { type, value } = event.data || {};
    if (type !== 'namespace-selected' || typeof value !== 'string' || !value) return;
    const { namespace, page } = document.body.dataset;
    if (value === namespace || !['notebooks', 'new'].includes(page)) return;
    location.href = pageLink(page === 'new' ? 'new' : './', value);
  });
  window.parent.postMessage({ type: 'iframe-connected' }, location.origin);
}
followDashboardNamespace();

/** The user menu's namespace picker: every namespace the user is in; choosing one shows its
 * notebooks (or its spawner form, from the form). */
async function fillNamespacePicker() {
  const picker = document.getElementById('namespace-picker');
  if (!picker) return;
  const { status, body } = await api('GET', 'api/namespaces');
  if (status !== 200) return;
  const current = document.body.dataset.namespace;
  const roles = new Map(Object.entries(body.roles || {}));
  picker.replaceChildren(...body.namespaces.map((name) => el('option',
    { value: name, selected: name === current ? '' : null },
    roles.has(name) ? `${name} (${roles.get(name)})` : name)));
  picker.addEventListener('change', () => {
    location.href = pageLink(document.body.dataset.page === 'new' ? 'new' : './', picker.value);
  });
}
fillNamespacePicker();

/** A namespace's quota answer as one line, each limited resource with what is held of it; ''
 * when the namespace has no quota. */
export function quotaSummary({ namespace, quota, inUse }) {
  if (!quota) return '';
  const parts = [];
  if (quota.cpu) parts.push(`CPU ${Number(inUse.cpu.toFixed(3))} of ${quota.cpu}`);
  if (quota.memory) parts.push(`memory ${bytes(inUse.memoryBytes)} of ${quota.memory}`);
  if (quota.gpus !== undefined) parts.push(`GPUs ${inUse.gpus} of ${quota.gpus}`);
  if (quota.notebooks !== undefined) parts.push(`running notebooks ${inUse.notebooks} of ${quota.notebooks}`);
  if (quota.storage) parts.push(`storage ${bytes(inUse.storageBytes)} of ${quota.storage}`);
  return `Quota of ${namespace}, in use: ${parts.join(' · ')}.`;
}

/** Fills `node` with namespace `ns`'s quota line, or hides it when there is none. */
export async function showQuota(node, ns) {
  const { status, body } = await api('GET', `api/namespaces/${encodeURIComponent(ns)}/quota`);
  const text = status === 200 ? quotaSummary(body) : '';
  node.textContent = text;
  node.hidden = !text;
}
