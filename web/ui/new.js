// The spawner form: validates names as they are typed, sends the request, shows the server's
// errors next to the field they concern.
import { api, el, showErrors, pageLink, showQuota } from './common.js';

const form = document.getElementById('spawner');
const ns = document.body.dataset.namespace;
const NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

form.name.addEventListener('input', () => {
  const value = form.name.value;
  const slot = form.querySelector('[data-error-for="name"]');
  const ok = value === '' || (NAME.test(value) && value.length <= 63);
  slot.textContent = ok ? '' : 'Use lowercase letters, digits and "-", starting and ending with a letter or digit (at most 63).';
  if (ok) form.name.removeAttribute('aria-invalid'); else form.name.setAttribute('aria-invalid', 'true');
});

function serverType() { return form.querySelector('input[name=serverType]:checked').value; }
for (const radio of form.querySelectorAll('input[name=serverType]')) {
  radio.addEventListener('change', () => {
    for (const node of form.querySelectorAll('[data-type]')) node.hidden = node.dataset.type !== serverType();
  });
}
function workspaceKind() { return form.querySelector('input[name=workspace]:checked').value; }
for (const radio of form.querySelectorAll('input[name=workspace]')) {
  radio.addEventListener('change', () => {
    const kind = workspaceKind();
    for (const id of ['workspaceSize']) { form[id].hidden = kind !== 'new'; form.querySelector(`label[for=${id}]`).hidden = kind !== 'new'; }
    form.workspaceName.hidden = kind !== 'existing';
    form.querySelector('label[for=workspaceName]').hidden = kind !== 'existing';
  });
}

showQuota(document.getElementById('quota-use'), ns);

// The namespace's volumes, offered for an existing workspace.
api('GET', `api/namespaces/${ns}/volumes`).then(({ status, body }) => {
  if (status !== 200) return;
  const list = document.getElementById('workspace-volumes');
  for (const volume of body.volumes) list.append(el('option', { value: volume.name }));
});

let rows = 0;
function removable(row) {
  return el('button', { type: 'button', class: 'secondary', onclick: () => row.remove() }, 'Remove');
}
/** A labelled input of a volume or variable row, with the slot its error goes to. */
function cell(label, id, key, attributes = {}) {
  return el('div', {},
    el('label', { for: id }, label),
    el('input', { id, class: key, ...attributes }),
    el('p', { class: 'error', 'data-key': key, 'data-input': id }));
}
document.getElementById('add-volume').addEventListener('click', () => {
  const i = rows++;
  const row = el('div', { class: 'row volume' },
    cell('Volume name', `vol-name-${i}`, 'vol-name'),
    cell('Size', `vol-size-${i}`, 'vol-size', { value: '10Gi' }),
    cell('Mount path', `vol-path-${i}`, 'vol-path', { value: '/data' }));
  row.append(removable(row));
  document.getElementById('volumes').append(row);
});
document.getElementById('add-env').addEventListener('click', () => {
  const i = rows++;
  const row = el('div', { class: 'row env' },
    cell('Name', `env-name-${i}`, 'env-name'),
    cell('Value', `env-value-${i}`, 'env-value'),
    el('div', {}));
  row.append(removable(row));
  document.getElementById('envs').append(row);
});

/** Names each row's error slots after the request fields the server will name. */
function nameRowSlots() {
  const volumeFields = { 'vol-name': 'name', 'vol-size': 'size', 'vol-path': 'mountPath' };
  [...form.querySelectorAll('.volume')].forEach((row, i) => {
    for (const slot of row.querySelectorAll('[data-key]')) {
      slot.dataset.errorFor = `dataVolumes[${i}].${volumeFields[slot.dataset.key]}`;
    }
  });
  for (const row of form.querySelectorAll('.env')) {
    const name = row.querySelector('.env-name').value.trim();
    const slot = row.querySelector('[data-key="env-name"]');
    slot.textContent = '';
    if (name) slot.dataset.errorFor = `environment.${name}`; else delete slot.dataset.errorFor;
  }
  // Without a custom image box, an image error is about the list of the chosen server type.
  const imageSlot = form.querySelector('[data-error-for="image"]');
  if (!form.customImage) imageSlot.dataset.input = `image-${serverType()}`;
}

form.addEventListener('submit', async (event) => {
  event.preventDefault();
  const type = serverType();
  const custom = form.customImage?.value.trim();
  const request = {
    name: form.name.value.trim(),
    serverType: type,
    image: custom || form[`image-${type}`].value,
    imagePullPolicy: form.imagePullPolicy.value,
    cpu: form.cpu.value.trim(),
    cpuLimit: form.cpuLimit.value.trim(),
    memory: form.memory.value.trim(),
    memoryLimit: form.memoryLimit.value.trim(),
    shmSize: form.shmSize.value.trim(),
    dataVolumes: [...form.querySelectorAll('.volume')].map((row) => ({
      name: row.querySelector('.vol-name').value.trim(),
      size: row.querySelector('.vol-size').value.trim(),
      mountPath: row.querySelector('.vol-path').value.trim(),
    })),
    environment: Object.fromEntries([...form.querySelectorAll('.env')]
      .map((row) => [row.querySelector('.env-name').value.trim(), row.querySelector('.env-value').value])
      .filter(([name]) => name)),
  };
  const kind = workspaceKind();
  request.workspace = kind === 'new' ? { new: { size: form.workspaceSize.value.trim() } }
    : kind === 'existing' ? { existing: { name: form.workspaceName.value.trim() } } : 'none';
  request.autoSave = form.autoSave.checked;
  if (form.gpuVendor?.value) request.gpus = { vendor: form.gpuVendor.value, count: Number(form.gpuCount.value) };
  nameRowSlots();
  const button = document.getElementById('create');
  button.disabled = true;
  const { status, body } = await api('POST', `api/namespaces/${ns}/notebooks`, request);
  button.disabled = false;
  if (status === 201) {
    location.href = pageLink('./', ns);
  } else {
    showErrors(form, body, document.getElementById('form-error'));
  }
});
