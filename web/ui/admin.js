// Every user's notebooks in one view, with filters, sorting, bulk stop and totals.
import { api, el, stateBadge, ago, bytes, gpuText, breakable } from './common.js';

const filters = document.getElementById('filters');
const body = document.querySelector('#all tbody');
const bulk = document.getElementById('bulk-stop');
let notebooks = [];

function quantity(text) {
  const m = /^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$/.exec(text || '');
  if (!m) return 0;
  const unit = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 }[m[2]] || 1;
  return Number(m[1]) * unit;
}

const SORTS = {
  activity: (a, b) => (Date.parse(b.lastActivity || 0) || 0) - (Date.parse(a.lastActivity || 0) || 0),
  cpu: (a, b) => quantity(b.cpuLimit) - quantity(a.cpuLimit),
  memory: (a, b) => quantity(b.memoryLimit) - quantity(a.memoryLimit),
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
    return el('tr', {},
      el('td', {}, el('input', { type: 'checkbox', value: key, checked: keep.has(key), 'aria-label': `Select ${key}`, onchange: update })),
      el('td', {}, nb.namespace),
      el('td', {}, el('a', { href: `/notebooks/${nb.namespace}/${nb.name}` }, nb.name)),
      el('td', {}, nb.owner),
      el('td', {}, stateBadge(nb.state, nb.reason)),
      el('td', { class: 'wrap' }, breakable(nb.image)),
      el('td', {}, nb.cpuLimit),
      el('td', {}, nb.memoryLimit),
      el('td', {}, gpuText(nb.gpus)),
      el('td', { title: nb.lastActivity || '' }, ago(nb.lastActivity)));
  }));
  update();
}

function update() { bulk.disabled = selected().length === 0; }

async function load() {
  const query = new URLSearchParams();
  for (const key of ['user', 'namespace', 'state']) if (filters[key].value.trim()) query.set(key, filters[key].value.trim());
  const { status, body: answer } = await api('GET', `/api/admin/notebooks?${query}`);
  if (status !== 200) return;
  notebooks = answer.notebooks;
  const t = answer.totals;
  document.getElementById('totals').replaceChildren(
    el('div', {}, el('b', {}, t.running), 'running notebooks'),
    el('div', {}, el('b', {}, t.notebooks), 'notebooks listed'),
    el('div', {}, el('b', {}, Number(t.cpu).toFixed(1)), 'CPUs in use (limits)'),
    el('div', {}, el('b', {}, bytes(t.memoryBytes)), 'memory in use (limits)'),
    el('div', {}, el('b', {}, t.gpus), 'GPUs in use'));
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
    await api('PATCH', `/api/namespaces/${ns}/notebooks/${name}`, { stopped: true });
  }
  // Done with that selection: a later bulk stop starts from nothing ticked.
  for (const box of body.querySelectorAll('input[type=checkbox]')) box.checked = false;
  document.getElementById('select-all').checked = false;
  load();
});
load();
setInterval(load, 5000);
