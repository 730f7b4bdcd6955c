// The user's notebooks, kept live by the namespace's event stream.
import { api, el, stateBadge, ago, gpuText, notebookUrl, breakable } from './common.js';

const ns = document.body.dataset.namespace;
const body = document.querySelector('#notebooks tbody');
const live = document.getElementById('live');
const empty = document.getElementById('empty');

async function act(notebook, change) {
  const path = `/api/namespaces/${ns}/notebooks/${notebook.name}`;
  const answer = change === 'delete'
    ? await api('DELETE', path)
    : await api('PATCH', path, { stopped: change === 'stop' });
  if (answer.status >= 400) alert(answer.body?.error || `failed (HTTP ${answer.status})`);
}

function render(notebooks) {
  empty.hidden = notebooks.length > 0;
  body.replaceChildren(...notebooks.map((nb) => {
    const running = nb.state === 'ready' || nb.state === 'starting';
    return el('tr', { 'data-name': nb.name },
      el('td', {}, el('a', { href: `/notebooks/${nb.namespace}/${nb.name}` }, nb.name)),
      el('td', {}, stateBadge(nb.state, nb.reason)),
      el('td', {}, nb.serverType === 'vscode' ? 'VSCode' : 'JupyterLab'),
      el('td', { class: 'wrap' }, breakable(nb.image)),
      el('td', {}, nb.cpuLimit || nb.cpu),
      el('td', {}, nb.memoryLimit || nb.memory),
      el('td', {}, gpuText(nb.gpus)),
      el('td', { title: nb.lastActivity || '' }, ago(nb.lastActivity)),
      el('td', {},
        nb.state === 'ready' ? el('a', { class: 'button', href: notebookUrl(nb), target: '_blank', rel: 'noopener' }, 'Connect') : null,
        running
          ? el('button', { type: 'button', class: 'secondary', onclick: () => act(nb, 'stop') }, 'Stop')
          : el('button', { type: 'button', class: 'secondary', onclick: () => act(nb, 'start') }, 'Start'),
        el('button', { type: 'button', class: 'danger', onclick: () => {
          if (confirm(`Delete notebook ${nb.name}? Its workspace volume is kept.`)) act(nb, 'delete');
        } }, 'Delete')));
  }));
}

function connect() {
  const events = new EventSource(`/api/namespaces/${ns}/watch`);
  events.addEventListener('notebooks', (event) => {
    render(JSON.parse(event.data).notebooks);
    live.textContent = `Live · updated ${new Date().toLocaleTimeString()}`;
  });
  events.onerror = () => { live.textContent = 'Reconnecting…'; };
}
connect();
