// One notebook: live status, events, following logs, and "Save environment as image" with its
// progress, plus the images saved from it.
import { api, el, stateBadge, ago, agoEl, bytes, gpuUse, showErrors, breakable, cpuUse, memoryUse, pageLink, serverName, showQuota } from './common.js';

const root = document.getElementById('notebook');
const { ns, name } = root.dataset;
const path = `api/namespaces/${ns}/notebooks/${name}`;
let current = null;

function pad(n) { return String(n).padStart(2, '0'); }
const now = new Date();
document.getElementById('tag').value =
  `saved-${now.getFullYear()}${pad(now.getMonth() + 1)}${pad(now.getDate())}-${pad(now.getHours())}${pad(now.getMinutes())}${pad(now.getSeconds())}`;

async function refresh() {
  const { status, body } = await api('GET', path);
  if (status !== 200) return;
  const nb = body.notebook;
  const stateChanged = current?.state !== nb.state;
  current = nb;
  if (stateChanged) ports();
  document.getElementById('state').replaceWith(Object.assign(stateBadge(nb.state, nb.reason), { id: 'state' }));
  document.getElementById('reason').textContent = nb.reason;
  const running = nb.state === 'ready' || nb.state === 'starting';
  const toggle = document.getElementById('toggle');
  toggle.textContent = running ? 'Stop' : 'Start';
  document.getElementById('connect').hidden = nb.state !== 'ready';
  document.getElementById('save-button').disabled = nb.state !== 'ready';
  document.getElementById('auto-save').checked = nb.autoSave;
  const details = [['Owner', nb.owner], ['Type', serverName(nb.serverType)], ['Image', nb.image],
    ['CPU', `${nb.cpu} request, ${nb.cpuLimit} limit`], ['Memory', `${nb.memory} request, ${nb.memoryLimit} limit`],
    ['CPU in use', el('span', { id: 'cpu-use' })], ['Memory in use', el('span', { id: 'memory-use' })],
    ['GPU', el('span', { id: 'gpu-use' })], ['Created', nb.created ? new Date(nb.created).toLocaleString() : ''], ['Last activity', agoEl('span', nb.lastActivity)]];
  document.getElementById('details').replaceChildren(...details.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
  showUsage(nb);
  showShares(nb.sharedWith || []);
  const resize = document.getElementById('resize');
  // What is being typed stays; the fields follow the notebook otherwise.
  if (!resize.contains(document.activeElement)) {
    resize.cpu.value = nb.cpu;
    resize.memory.value = nb.memory;
  }
  const conditions = nb.status?.conditions || [];
  document.getElementById('conditions').replaceChildren(...(conditions.length
    ? conditions.map((c) => el('li', {}, `${c.type}: ${c.status}${c.reason ? ` (${c.reason})` : ''}${c.message ? ` — ${c.message}` : ''}`))
    : [el('li', { class: 'hint' }, 'none')]));
  followLogs(running);
}

/** What it uses now, from the latest sample (the namespace's stream brings one every few seconds). */
function showUsage(nb) {
  const unmeasured = nb?.state === 'ready' ? 'not measured yet' : 'not running';
  document.getElementById('cpu-use')?.replaceChildren(nb?.usage ? cpuUse(nb) : unmeasured);
  document.getElementById('memory-use')?.replaceChildren(nb?.usage ? memoryUse(nb) : unmeasured);
  document.getElementById('gpu-use')?.replaceChildren(nb ? gpuUse(nb) : '—');
  document.getElementById('memory-warning').hidden = !nb?.usage?.memoryNearLimit;
}

/** "pip: added x 1.0; upgraded y 1.0→2.0 · files: 12 added, 3 changed, 0 deleted". */
function summaryText(image) {
  const s = image.summary;
  if (!s) return `${image.filesChanged} changed, ${image.filesDeleted} deleted`;
  const parts = [];
  for (const [label, changes] of [['pip', s.python], ['conda', s.conda], ['apt', s.debian]]) {
    if (!changes) continue;
    const bits = [];
    if (changes.added.length) bits.push(`added ${changes.added.map((p) => `${p.name} ${p.version}`).join(', ')}`);
    if (changes.upgraded.length) bits.push(`upgraded ${changes.upgraded.map((u) => `${u.name} ${u.from}→${u.to}`).join(', ')}`);
    if (changes.removed.length) bits.push(`removed ${changes.removed.map((p) => p.name).join(', ')}`);
    if (bits.length) parts.push(`${label}: ${bits.join('; ')}`);
  }
  parts.push(`files: ${s.files.added} added, ${s.files.changed} changed, ${s.files.deleted} deleted`);
  return parts.join(' · ');
}

/** Whom the notebook is shared with, each with a button that stops it. */
function showShares(users) {
  document.getElementById('shares').replaceChildren(...(users.length ? users.map((user) =>
    el('li', { 'data-user': user }, `Shared with ${user} `,
      el('button', { type: 'button', class: 'secondary', onclick: async () => {
        const answer = await api('DELETE', `${path}/shares/${encodeURIComponent(user)}`);
        if (answer.status >= 400) alert(answer.body?.error || `failed (HTTP ${answer.status})`);
        refresh();
      } }, 'Stop sharing')))
    : [el('li', { class: 'hint' }, 'Not shared with anyone.')]));
}

document.getElementById('share').addEventListener('submit', async (event) => {
  event.preventDefault();
  const form = event.target;
  const answer = await api('POST', `${path}/shares`, { user: form.user.value.trim() });
  const error = document.querySelector('#sharing [data-error-for="user"]');
  error.textContent = answer.status >= 400 ? (answer.body?.error || `failed (HTTP ${answer.status})`) : '';
  if (answer.status >= 400) return;
  form.user.value = '';
  refresh();
});

document.getElementById('resize').addEventListener('submit', async (event) => {
  event.preventDefault();
  const form = event.target;
  const answer = await api('PATCH', path, { cpu: form.cpu.value.trim(), memory: form.memory.value.trim() });
  const error = document.getElementById('resize-error');
  if (answer.status >= 400) {
    showErrors(form, answer.body, error);
    return;
  }
  for (const node of form.querySelectorAll('[data-error-for]')) node.textContent = '';
  for (const node of form.querySelectorAll('[aria-invalid]')) node.removeAttribute('aria-invalid');
  error.textContent = '';
  document.activeElement?.blur();
  refresh();
  showQuota(document.getElementById('quota-use'), ns);
});
showQuota(document.getElementById('quota-use'), ns);

document.getElementById('auto-save').addEventListener('change', async (event) => {
  const answer = await api('PATCH', path, { autoSave: event.target.checked });
  if (answer.status >= 400) alert(answer.body?.error);
});

document.getElementById('toggle').addEventListener('click', async () => {
  if (!current) return;
  const stop = current.state === 'ready' || current.state === 'starting';
  const answer = await api('PATCH', path, { stopped: stop });
  if (answer.status >= 400) alert(answer.body?.error);
});

async function events() {
  const { status, body } = await api('GET', `${path}/events`);
  if (status !== 200) return;
  document.querySelector('#events tbody').replaceChildren(...body.events.slice().reverse().map((e) =>
    el('tr', {}, agoEl('td', e.time), el('td', {}, e.type), el('td', {}, e.reason), el('td', { class: 'wrap' }, e.count > 1 ? `${e.message} (${e.count} times)` : e.message))));
}

let logs = null;
async function followLogs(running) {
  const wanted = running && document.getElementById('follow').checked;
  if (!wanted) { logs?.abort(); logs = null; return; }
  if (logs) return;
  logs = new AbortController();
  const out = document.getElementById('logs');
  try {
    const response = await fetch(`${path}/logs?follow=true&tail=300`, { signal: logs.signal });
    if (!response.ok) { logs = null; return; }
    out.textContent = '';
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      out.textContent += value;
      if (out.textContent.length > 200_000) out.textContent = out.textContent.slice(-150_000);
      if (stick) out.scrollTop = out.scrollHeight;
    }
  } catch { /* aborted */ }
  logs = null;
}
document.getElementById('follow').addEventListener('change', () => followLogs(current && current.state !== 'stopped'));

let saved = [];
async function images() {
  const { status, body } = await api('GET', `api/namespaces/${ns}/images`);
  if (status !== 200) return;
  const mine = body.images.filter((i) => i.notebook === name);
  saved = mine;
  document.getElementById('images-empty').hidden = mine.length > 0;
  document.querySelector('#images tbody').replaceChildren(...mine.map((i) => el('tr', {},
    el('td', { class: 'wrap' }, breakable(i.image),
      el('div', { class: 'muted', title: i.digest }, i.digest.slice(0, 19)),
      el('div', { class: 'muted' }, i.sharedWith.length ? `Shared with ${i.sharedWith.join(', ')} ` : 'Not shared ',
        el('button', { type: 'button', class: 'link', onclick: async () => {
          const typed = prompt(`Namespaces whose notebooks may run ${i.image} (comma-separated; empty: no one)`, i.sharedWith.join(', '));
          if (typed === null) return;
          const sharedWith = typed.split(',').map((n) => n.trim()).filter((n) => n);
          const answer = await api('PUT', `api/namespaces/${ns}/images/sharing`, { image: i.image, sharedWith });
          if (answer.status >= 400) alert(answer.body?.error || `failed (HTTP ${answer.status})`);
          images();
        } }, 'Share…'))),
    el('td', {}, bytes(i.layerBytes)),
    el('td', { class: 'wrap' }, summaryText(i)),
    agoEl('td', i.created),
    el('td', { class: 'actions' },
      el('a', { class: 'button secondary', href: pageLink('new', ns, { image: i.image }) }, 'Start a new notebook from it'),
      el('button', { type: 'button', class: 'secondary', onclick: async () => {
        if (!confirm(`Restart ${name} on ${i.image}? Unsaved changes outside the workspace are lost.`)) return;
        const answer = await api('PATCH', path, { image: i.image, stopped: false });
        if (answer.status >= 400) alert(answer.body?.error);
      } }, 'Restart this notebook on it'),
      el('button', { type: 'button', class: 'danger', onclick: async () => {
        if (!confirm(`Delete ${i.image}? It is deleted from the registry: no notebook can start from it again.`)) return;
        const answer = await api('DELETE', `api/namespaces/${ns}/images?image=${encodeURIComponent(i.image)}`);
        if (answer.status >= 400) alert(answer.body?.error || `failed (HTTP ${answer.status})`);
        images();
        events();
      } }, 'Delete')))));
}

const PHASES = { queued: [0, 2], indexing: [2, 8], scanning: [8, 30], writing: [30, 85], uploading: [85, 99], done: [100, 100], unchanged: [100, 100], failed: [0, 0] };
function showProgress(s) {
  const [low, high] = PHASES[s.phase] || [0, 0];
  let value = low;
  if (s.phase === 'writing' && s.bytesTotal) value = low + (high - low) * Math.min(1, s.bytesWritten / s.bytesTotal);
  const bar = document.getElementById('save-bar');
  bar.value = s.phase === 'failed' ? bar.value : value;
  const text = {
    queued: 'Queued', indexing: 'Reading the base image…',
    scanning: `Scanning: ${s.entriesScanned.toLocaleString()} files`,
    // The total is estimated before the layer is written: the share shown never passes it.
    writing: `Writing the layer: ${s.bytesTotal ? Math.min(100, Math.round((100 * s.bytesWritten) / s.bytesTotal)) : 0} %`,
    uploading: `Uploading ${bytes(s.layerBytes)}…`,
    done: `Saved ${s.target} @ ${s.digest} (layer ${bytes(s.layerBytes)})`,
    unchanged: 'Nothing changed since the image this notebook runs: no image was made',
    failed: 'Save failed',
  }[s.phase] || s.phase;
  document.getElementById('save-text').textContent = s.warning ? `${text} — ${s.warning}` : text;
  document.getElementById('save-error').textContent = s.phase === 'failed' ? s.error : '';
}

document.getElementById('save').addEventListener('submit', async (event) => {
  event.preventDefault();
  const form = event.target;
  const button = document.getElementById('save-button');
  const tag = form.tag.value.trim();
  // A tag names one image: saving under it again moves it, so that is asked first.
  const taken = tag && saved.find((i) => i.image.endsWith(`:${tag}`));
  if (taken && !confirm(`${taken.image} is already saved from this notebook. Move the tag to a new save?`)) return;
  const { status, body } = await api('POST', `${path}/saves`, { tag });
  if (status !== 202) { showErrors(form.parentElement, body, document.getElementById('save-error')); return; }
  showErrors(form.parentElement, null);
  button.disabled = true;
  document.getElementById('save-progress').hidden = false;
  showProgress(body);
  const stream = new EventSource(`api/namespaces/${ns}/saves/${body.id}`);
  stream.addEventListener('progress', (e) => {
    const s = JSON.parse(e.data);
    showProgress(s);
    if (['done', 'unchanged', 'failed'].includes(s.phase)) {
      stream.close();
      button.disabled = current?.state !== 'ready';
      images();
      events();
    }
  });
  stream.onerror = () => { stream.close(); button.disabled = false; };
});

const watch = new EventSource(`api/namespaces/${ns}/watch`);
watch.addEventListener('notebooks', (event) => {
  const nb = JSON.parse(event.data).notebooks.find((n) => n.name === name);
  // A new sample alone changes no more than the use shown.
  if (nb && current && nb.resourceVersion === current.resourceVersion) {
    showUsage(nb);
    return;
  }
  refresh();
  events();
});
/** The ports something listens on, each with its address, whom it is open to, and Open. */
const SHARINGS = [['private', 'Those who may open this notebook'], ['namespace', `Members of ${ns}`], ['all', 'Everyone signed in']];
let portsAsked = 0;
async function ports() {
  // Only the latest listing is shown: one asked before the notebook stopped may answer after.
  const asked = ++portsAsked;
  const error = document.getElementById('ports-error');
  if (current?.state !== 'ready') {
    document.querySelector('#ports tbody').replaceChildren();
    Object.assign(document.getElementById('ports-empty'), { textContent: 'The notebook is not running.', hidden: false });
    return;
  }
  const { status, body } = await api('GET', `${path}/ports`);
  if (asked !== portsAsked) return;
  if (status !== 200) {
    error.textContent = body.error || `listing ports failed (${status})`;
    return;
  }
  error.textContent = '';
  document.getElementById('ports-empty').textContent = 'Nothing listens in this notebook besides its own server.';
  document.getElementById('ports-empty').hidden = body.ports.length > 0;
  document.querySelector('#ports tbody').replaceChildren(...body.ports.map((p) => {
    const select = el('select', { 'aria-label': `Who may open port ${p.port}` },
      ...SHARINGS.map(([value, label]) => el('option', { value, selected: value === p.sharing }, label)));
    select.addEventListener('change', async () => {
      const answer = await api('PUT', `${path}/ports/${p.port}`, { sharing: select.value });
      error.textContent = answer.status === 200 ? '' : (answer.body.error || `sharing failed (${answer.status})`);
      ports();
    });
    return el('tr', { 'data-port': String(p.port) }, el('td', {}, String(p.port)), el('td', { class: 'wrap' }, breakable(p.address)),
      el('td', {}, select), el('td', { class: 'actions' }, el('a', { class: 'button secondary', href: p.address, target: '_blank', rel: 'noopener' }, 'Open')));
  }));
}

refresh();
events();
images();
setInterval(events, 4000);
// Listing asks the notebook's agent: every 10 s is enough to see a server just started.
setInterval(() => { if (!document.hidden) ports(); }, 10000);
