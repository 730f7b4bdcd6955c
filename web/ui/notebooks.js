// The user's notebooks, kept live by the namespace's event stream.
import { api, el, stateCell, ago, agoEl, gpuUse, notebookUrl, breakable, cpuUse, memoryUse, serverName } from './common.js';

const ns = document.body.dataset.namespace;
const body = document.querySelector('#notebooks tbody');
const live = document.getElementById('live');
const empty = document.getElementById('empty');

async function act(notebook, change) {
  const path = `api/namespaces/${ns}/notebooks/${notebook.name}`;
  const answer = change === 'delete'
    ? await api('DELETE', path)
    : await api('PATCH', path, { stopped: change === 'stop' });
  if (answer.status >= 400) alert(answer.body?.error || `failed (HTTP ${answer.status})`);
}

// What the table was last built from: a new sample of resource use alone changes only the cells
// that show it, so clicks, focus and the reader's place survive it.
let built = null;

function updateUse(notebooks) {
  for (const nb of notebooks) {
    const row = body.querySelector(`tr[data-name="${CSS.escape(nb.name)}"]`);
    if (!row) continue;
    const cells = row.children;
    cells[4].replaceChildren(cpuUse(nb));
    cells[5].replaceChildren(memoryUse(nb));
    cells[6].replaceChildren(gpuUse(nb));
    cells[7].replaceChildren(ago(nb.lastActivity));
    cells[7].title = nb.lastActivity || '';
    cells[7].dataset.ago = nb.lastActivity || '';
    row.classList.toggle('near-limit', Boolean(nb.usage?.memoryNearLimit));
  }
}

/** Shows `notebooks`; `true` when the table was built again (not only its use updated). */
function render(notebooks) {
  const shape = notebooks.map((nb) => `${nb.name}@${nb.resourceVersion}@${nb.state}`).join(' ');
  if (shape === built) {
    updateUse(notebooks);
    return false;
  }
  built = shape;
  empty.hidden = notebooks.length > 0;
  body.replaceChildren(...notebooks.map((nb) => {
    const running = nb.state === 'ready' || nb.state === 'starting';
    return el('tr', { 'data-name': nb.name, class: nb.usage?.memoryNearLimit ? 'near-limit' : null },
      el('td', {}, el('a', { href: `notebooks/${nb.namespace}/${nb.name}` }, nb.name)),
      stateCell(nb),
      el('td', {}, serverName(nb.serverType)),
      el('td', { class: 'wrap' }, breakable(nb.image)),
      el('td', {}, cpuUse(nb)),
      el('td', {}, memoryUse(nb)),
      el('td', {}, gpuUse(nb)),
      agoEl('td', nb.lastActivity),
      el('td', {},
        nb.state === 'ready' ? el('a', { class: 'button', href: notebookUrl(nb), target: '_blank', rel: 'noopener' }, 'Connect') : null,
        running
          ? el('button', { type: 'button', class: 'secondary', onclick: () => act(nb, 'stop') }, 'Stop')
          : el('button', { type: 'button', class: 'secondary', onclick: () => act(nb, 'start') }, 'Start'),
        el('button', { type: 'button', class: 'danger', onclick: () => {
          if (confirm(`Delete notebook ${nb.name}? Its workspace volume is kept.`)) act(nb, 'delete');
        } }, 'Delete')));
  }));
  return true;
}

// Volumes outlive their notebooks (a deleted notebook's workspace is kept): listed with who
// mounts them, and deleted here once nothing does.
async function volumes() {
  const { status, body: answer } = await api('GET', `api/namespaces/${ns}/volumes`);
  if (status !== 200) return;
  document.getElementById('volumes-empty').hidden = answer.volumes.length > 0;
  document.querySelector('#volumes tbody').replaceChildren(...answer.volumes.map((v) =>
    el('tr', { 'data-name': v.name },
      el('td', {}, v.name),
      el('td', {}, v.usedBy.length ? v.usedBy.join(', ') : 'no notebook'),
      el('td', {}, v.usedBy.length ? null : el('button', { type: 'button', class: 'danger', onclick: async () => {
        if (!confirm(`Delete volume ${v.name}? Its files are lost for good.`)) return;
        const deleted = await api('DELETE', `api/namespaces/${ns}/volumes/${encodeURIComponent(v.name)}`);
        if (deleted.status >= 400) alert(deleted.body?.error || `failed (HTTP ${deleted.status})`);
        volumes();
      } }, 'Delete')))));
}

// The notebooks' names and states when the volumes were last read: a notebook's volumes are made
// as it starts and freed as it is deleted, so the list is read again when either changes (not
// at each use update).
let names = null;
function connect() {
  const events = new EventSource(`api/namespaces/${ns}/watch`);
  events.addEventListener('notebooks', (event) => {
    const notebooks = JSON.parse(event.data).notebooks;
    if (!render(notebooks)) return;
    live.textContent = `Live · updated ${new Date().toLocaleTimeString()}`;
    const now = notebooks.map((nb) => `${nb.name}:${nb.state}`).join(' ');
    if (now !== names) { names = now; volumes(); }
  });
  events.onerror = () => { live.textContent = 'Reconnecting…'; };
}
connect();

// Notebooks others shared with this user, wherever they are.
async function shared() {
  const { status, body: answer } = await api('GET', 'api/shared');
  if (status !== 200) return;
  document.getElementById('shared-empty').hidden = answer.notebooks.length > 0;
  document.getElementById('shared').hidden = answer.notebooks.length === 0;
  document.querySelector('#shared tbody').replaceChildren(...answer.notebooks.map((nb) =>
    el('tr', { 'data-name': nb.name },
      el('td', {}, el('a', { href: `notebooks/${nb.namespace}/${nb.name}` }, nb.name)),
      el('td', {}, nb.namespace),
      stateCell(nb),
      el('td', {}, nb.state === 'ready'
        ? el('a', { class: 'button', href: notebookUrl(nb), target: '_blank', rel: 'noopener' }, 'Connect')
        : null))));
}
shared();
setInterval(shared, 15_000);

// The namespace's owner and members; its owner (or an admin) adds and removes them.
async function members() {
  const { status, body: team } = await api('GET', `api/namespaces/${ns}/members`);
  const section = document.getElementById('members-section');
  // A cluster's members are Kubeflow's (501), and a namespace one is not in has none to show.
  section.hidden = status !== 200;
  if (status !== 200) return;
  const manages = team.role === 'owner';
  document.getElementById('members-owner').textContent =
    `Owner: ${team.owner}. You: ${team.role}.`;
  const entries = Object.entries(team.members);
  document.getElementById('members').replaceChildren(...(entries.length ? entries.map(([user, role]) =>
    el('li', { 'data-user': user }, `${user} (${role}) `,
      manages ? el('button', { type: 'button', class: 'secondary', onclick: async () => {
        const removed = await api('DELETE', `api/namespaces/${ns}/members/${encodeURIComponent(user)}`);
        if (removed.status >= 400) alert(removed.body?.error || `failed (HTTP ${removed.status})`);
        members();
      } }, 'Remove') : null))
    : [el('li', { class: 'hint' }, 'No members besides the owner.')]));
  document.getElementById('add-member').hidden = !manages;
}
document.getElementById('add-member').addEventListener('submit', async (event) => {
  event.preventDefault();
  const form = event.target;
  const user = form.user.value.trim();
  const answer = await api('PUT', `api/namespaces/${ns}/members/${encodeURIComponent(user)}`, { role: form.role.value });
  const error = document.querySelector('[data-error-for="member"]');
  error.textContent = answer.status >= 400 ? (answer.body?.error || `failed (HTTP ${answer.status})`) : '';
  if (answer.status < 400) form.user.value = '';
  members();
});
members();
