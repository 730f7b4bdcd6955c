// Every user's notebooks in one view, with filters, sorting, bulk stop and totals.
import { api, el, stateCell, ago, agoEl, bytes, gpuUse, breakable, quantity, cpuUse, memoryUse } from './common.js';

const filters = document.getElementById('filters');
const body = document.querySelector('#all tbody');
const bulk = document.getElementById('bulk-stop');
let notebooks = [];

const SORTS = {
  activity: (a, b) => (Date.parse(b.lastActivity || 0) || 0) - (Date.parse(a.lastActivity || 0) || 0),
  cpu: (a, b) => quantity(b.cpuLimit) - quantity(a.cpuLimit),
  memory: (a, b) => quantity(b.memoryLimit) - quantity(a.memoryLimit),
  cpuUsed: (a, b) => (b.usage?.cpuCores || 0) - (a.usage?.cpuCores || 0),
  memoryUsed: (a, b) => (b.usage?.memoryBytes || 0) - (a.usage?.memoryBytes || 0),
  gpu: (a, b) => Number(b.gpus?.count || 0) - Number(a.gpus?.count || 0),
  name: (a, b) => `${a.namespace}/${a.name}`.localeCompare(`${b.namespace}/${b.name}`),
};

function selected() {
  return [...body.querySelectorAll('input[type=checkbox]:checked')].map((box) => box.value);
}

function render() {
  const sorted = notebooks.slice().sort(SORTS[filters.sort.value]);
  document.getElementById('empty').hidden = sorted.length > 0;
  const keep = new Set(selected());
  body.replaceChildren(...sorted.map((nb) => {
    const key = `${nb.namespace}/${nb.name}`;
    return el('tr', { 'data-key': key, class: nb.usage?.memoryNearLimit ? 'near-limit' : null },
      el('td', {}, el('input', { type: 'checkbox', value: key, checked: keep.has(key), 'aria-label': `Select ${key}`, onchange: update })),
      el('td', {}, nb.namespace),
      el('td', {}, el('a', { href: `notebooks/${nb.namespace}/${nb.name}` }, nb.name)),
      el('td', {}, nb.owner),
      stateCell(nb),
      el('td', { class: 'wrap' }, breakable(nb.image)),
      el('td', {}, cpuUse(nb)),
      el('td', {}, memoryUse(nb)),
      el('td', {}, gpuUse(nb)),
      agoEl('td', nb.lastActivity));
  }));
  update();
}

function update() { bulk.disabled = selected().length === 0; }

async function load() {
  const query = new URLSearchParams();
  for (const key of ['user', 'namespace', 'state']) if (filters[key].value.trim()) query.set(key, filters[key].value.trim());
  if (filters.idleGpus.checked) query.set('idleHoldingGpus', 'true');
  const { status, body: answer } = await api('GET', `api/admin/notebooks?${query}`);
  if (status !== 200) return;
  notebooks = answer.notebooks;
  const t = answer.totals;
  document.getElementById('totals').replaceChildren(
    el('div', {}, el('b', {}, t.running), 'running notebooks'),
    el('div', {}, el('b', {}, t.notebooks), 'notebooks listed'),
    el('div', { id: 'total-cpu' }, el('b', {}, `${Number(t.cpuUsed).toFixed(2)} · ${Number(t.cpuRequested).toFixed(1)} · ${Number(t.cpu).toFixed(1)}`), 'CPUs used now · requested · limits'),
    el('div', { id: 'total-memory' }, el('b', {}, `${bytes(t.memoryBytesUsed)} · ${bytes(t.memoryBytesRequested)} · ${bytes(t.memoryBytes)}`), 'memory used now · requested · limits'),
    el('div', {}, el('b', {}, t.gpus), 'GPUs held'));
  render();
}

filters.addEventListener('input', (event) => (event.target.name === 'sort' ? render() : load()));
filters.addEventListener('submit', (event) => event.preventDefault());
document.getElementById('select-all').addEventListener('change', (event) => {
  for (const box of body.querySelectorAll('input[type=checkbox]')) box.checked = event.target.checked;
  update();
});
bulk.addEventListener('click', async () => {
  const keys = selected();
  if (!confirm(`Stop ${keys.length} notebook(s)?`)) return;
  for (const key of keys) {
    const [ns, name] = key.split('/');
    await api('PATCH', `api/namespaces/${ns}/notebooks/${name}`, { stopped: true });
  }
  // Done with that selection: a later bulk stop starts from nothing ticked.
  for (const box of body.querySelectorAll('input[type=checkbox]')) box.checked = false;
  document.getElementById('select-all').checked = false;
  load();
});
// The audit trail: exact user and namespace, as recorded.
const auditFilters = document.getElementById('audit-filters');
async function loadAudit() {
  const query = new URLSearchParams([...new FormData(auditFilters)].filter(([, v]) => v !== ''));
  const { status, body: answer } = await api('GET', `api/admin/audit?${query}`);
  const hint = document.getElementById('audit-hint');
  if (status !== 200) {
    hint.textContent = answer?.error || `The audit trail cannot be read here (HTTP ${status}).`;
    return;
  }
  const records = answer.records.slice(-200).reverse();
  document.getElementById('audit-empty').hidden = records.length > 0;
  document.querySelector('#audit tbody').replaceChildren(...records.map((r) =>
    el('tr', { class: r.result === 'ok' ? null : 'refused' },
      agoEl('td', r.time),
      el('td', {}, r.user || '(nobody)'),
      el('td', {}, r.from),
      el('td', { class: 'wrap' }, breakable(r.action)),
      el('td', {}, r.namespace ? `${r.namespace}${r.object ? `/${r.object}` : ''}` : ''),
      el('td', {}, `${r.status} ${r.result}`))));
}
auditFilters.addEventListener('input', loadAudit);
auditFilters.addEventListener('submit', (event) => event.preventDefault());

load();
loadAudit();
setInterval(load, 5000);
// The trail is read from files: less often than the notebooks' live state.
setInterval(loadAudit, 15000);

// Every namespace with its owner and members; admins add team namespaces here.
async function namespaces() {
  const { status, body: answer } = await api('GET', 'api/namespaces');
  // A cluster's namespaces are Kubeflow's Profiles: nothing of them is kept here.
  const section = document.getElementById('namespaces-section');
  section.hidden = status !== 200 || !answer.memberships?.length;
  if (section.hidden) return;
  document.querySelector('#namespaces tbody').replaceChildren(...answer.memberships.map((ns) =>
    el('tr', { 'data-name': ns.name },
      el('td', {}, ns.name),
      el('td', {}, ns.owner),
      el('td', {}, Object.entries(ns.members).map(([user, role]) => `${user} (${role})`).join(', ') || '—'))));
}
document.getElementById('add-namespace').addEventListener('submit', async (event) => {
  event.preventDefault();
  const form = event.target;
  const answer = await api('POST', 'api/namespaces', { name: document.getElementById('ns-name').value.trim(), owner: document.getElementById('ns-owner').value.trim() });
  document.getElementById('namespace-error').textContent =
    answer.status >= 400 ? (answer.body?.error || `failed (HTTP ${answer.status})`) : '';
  if (answer.status < 400) form.reset();
  namespaces();
});
namespaces();

// Use against quota per namespace; admins set and remove quotas here.
const quotaForm = document.getElementById('set-quota');
let quotas = [];
function against(used, limit) {
  return limit === undefined || limit === null ? `${used} (no quota)` : `${used} of ${limit}`;
}
async function loadQuotas() {
  const { status, body: answer } = await api('GET', 'api/admin/quotas');
  if (status !== 200) return;
  quotas = answer.namespaces;
  document.getElementById('quota-namespaces').replaceChildren(...quotas.map((q) => el('option', { value: q.namespace })));
  document.querySelector('#quotas tbody').replaceChildren(...quotas.map(({ namespace, quota, inUse }) => {
    const q = quota || {};
    return el('tr', { 'data-namespace': namespace, class: quota ? null : 'unlimited' },
      el('td', {}, namespace),
      el('td', {}, against(Number(inUse.cpu.toFixed(3)), q.cpu)),
      el('td', {}, against(bytes(inUse.memoryBytes), q.memory)),
      el('td', {}, against(inUse.gpus, q.gpus)),
      el('td', {}, against(inUse.notebooks, q.notebooks)),
      el('td', {}, against(bytes(inUse.storageBytes), q.storage)));
  }));
}
// Picking a namespace fills the form with its quota, to change one field of it.
document.getElementById('q-namespace').addEventListener('change', (event) => {
  const found = quotas.find((q) => q.namespace === event.target.value.trim());
  for (const field of ['cpu', 'memory', 'gpus', 'notebooks', 'storage']) {
    quotaForm[field].value = found?.quota?.[field] ?? '';
  }
});
async function setQuota(quota) {
  const ns = quotaForm.namespace.value.trim();
  const error = document.getElementById('quota-error');
  if (!ns) { error.textContent = 'Name the namespace.'; return; }
  const answer = await api('PUT', `api/namespaces/${encodeURIComponent(ns)}/quota`, quota);
  error.textContent = answer.status >= 400 ? (answer.body?.error || `failed (HTTP ${answer.status})`) : '';
  loadQuotas();
}
quotaForm.addEventListener('submit', (event) => {
  event.preventDefault();
  const quota = {};
  for (const field of ['cpu', 'memory', 'storage']) if (quotaForm[field].value.trim()) quota[field] = quotaForm[field].value.trim();
  for (const field of ['gpus', 'notebooks']) if (quotaForm[field].value !== '') quota[field] = Number(quotaForm[field].value);
  setQuota(quota);
});
document.getElementById('clear-quota').addEventListener('click', () => setQuota(null));
loadQuotas();
setInterval(loadQuotas, 15000);
