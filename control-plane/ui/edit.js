// Create, edit and delete APIs and upstreams through the admin API. An edit sends the whole resource (PUT), the
// form's fields laid over what was loaded, so settings the form does not show are kept. The API's problem details
// come back with a JSON pointer per bad field; each is shown next to the field it names.

import { ApiError, get, itemPath, listAll, request } from './api.js';
import { announce, h, replace } from './dom.js';
import { deleteResource } from './pages.js';

const READ_ONLY = 'This session is read-only: its token may read but not change the configuration.';

function readOnlyNotice() {
  return h('section', {},
    h('h1', {}, 'Edit'),
    h('p', { class: 'notice warn', role: 'alert' }, READ_ONLY));
}

export async function editPage(ctx) {
  if (!ctx.canWrite) return readOnlyNotice();
  const [apis, upstreams] = await Promise.all([listAll('apis'), listAll('upstreams')]);
  const list = (kind, collection, items) => h('ul', { class: 'edit-list' }, items.map((item) => h('li', {},
    h('span', { class: 'name' }, item.name),
    h('a', { class: 'button', href: `#/edit/${kind}/${encodeURIComponent(item.name)}`, 'aria-label': `Edit ${kind} ${item.name}` }, 'Edit'),
    h('button', { type: 'button', class: 'danger', 'aria-label': `Delete ${kind} ${item.name}`, onclick: () => deleteResource(collection, item.name, '#/edit') }, 'Delete'))));
  return h('section', {},
    h('h1', {}, 'Edit'),
    h('div', { class: 'columns' },
      h('div', {},
        h('div', { class: 'title-row' }, h('h2', {}, 'APIs'), h('a', { class: 'button primary', href: '#/edit/api/new', id: 'new-api' }, 'New API')),
        apis.length ? list('api', 'apis', apis) : h('p', {}, 'None yet.')),
      h('div', {},
        h('div', { class: 'title-row' }, h('h2', {}, 'Upstreams'), h('a', { class: 'button primary', href: '#/edit/upstream/new', id: 'new-upstream' }, 'New upstream')),
        upstreams.length ? list('upstream', 'upstreams', upstreams) : h('p', {}, 'None yet.'))));
}

// ---- Form plumbing

/// A labelled field with a help line and a slot for its error, tied together with aria-describedby.
function field(id, label, control, help) {
  const errorId = `${id}-error`;
  const helpId = help ? `${id}-help` : null;
  control.id = id;
  control.setAttribute('aria-describedby', [helpId, errorId].filter(Boolean).join(' '));
  const checkbox = control.type === 'checkbox';
  return h('div', { class: checkbox ? 'field check' : 'field', 'data-field': id },
    checkbox ? [control, h('label', { for: id }, label)] : [h('label', { for: id }, label), control],
    help ? h('p', { class: 'help', id: helpId }, help) : null,
    h('p', { class: 'field-error', id: errorId }));
}

const lines = (text) => text.split('\n').map((line) => line.trim()).filter(Boolean);
const commaList = (text) => text.split(',').map((item) => item.trim()).filter(Boolean);

function clearErrors(form) {
  for (const slot of form.querySelectorAll('.field-error')) replace(slot);
  for (const control of form.querySelectorAll('[aria-invalid]')) control.removeAttribute('aria-invalid');
}

function setFieldError(form, id, text) {
  const control = form.querySelector(`#${CSS.escape(id)}`);
  const slot = form.querySelector(`#${CSS.escape(`${id}-error`)}`);
  if (!control || !slot) return false;
  slot.append(slot.textContent ? ' ' : '', text);
  control.setAttribute('aria-invalid', 'true');
  return true;
}

/// The form field a problem's pointer names: `/path_prefix` in a body, or `/apis/<name>/path_prefix` from the
/// whole-configuration checks. Deeper pointers (`/targets/0/url`) name their top field and say which item.
export function fieldFor(pointer, collection, name) {
  let parts = String(pointer || '').split('/').slice(1).map((part) => part.replaceAll('~1', '/').replaceAll('~0', '~'));
  if (parts[0] === collection) {
    if (parts[1] !== name) return null;
    parts = parts.slice(2);
  }
  if (!parts.length || !parts[0]) return null;
  const [top, second, ...rest] = parts;
  const numbered = /^\d+$/.test(second || '');
  const where = numbered ? `item ${Number(second) + 1}${rest.length ? ` (${rest.join('.')})` : ''}: ` : '';
  // A nested setting (`/tls/sni`) has its own field where the form shows one; else its parent's field holds it.
  return { fields: second && !numbered ? [second, top] : [top], prefix: where };
}

function showProblem(form, summary, error, collection, name, prefix) {
  clearErrors(form);
  const unplaced = [];
  if (error instanceof ApiError) {
    for (const entry of error.errors) {
      const target = fieldFor(entry.pointer, collection, name);
      const placed = target?.fields.some((field) => setFieldError(form, `${prefix}-${field}`, `${target.prefix}${entry.detail}`));
      if (!placed) {
        unplaced.push(`${entry.pointer || '/'}: ${entry.detail}`);
      }
    }
  }
  const status = error instanceof ApiError && error.status ? `HTTP ${error.status} · ` : '';
  replace(summary,
    h('h2', {}, error instanceof ApiError && error.problem?.title ? error.problem.title : 'Not saved'),
    h('p', {}, status, error.message),
    unplaced.length ? h('ul', {}, unplaced.map((text) => h('li', {}, text))) : null);
  summary.hidden = false;
  summary.focus();
}

function parseJson(form, id, text, fallback) {
  if (!text.trim()) return fallback;
  try {
    return JSON.parse(text);
  } catch (error) {
    setFieldError(form, id, `not JSON: ${error.message}`);
    throw error;
  }
}

async function save(form, summary, collection, name, body, prefix, then) {
  const path = name ? itemPath(collection, name) : `/v1/${collection}`;
  try {
    const { version } = await request(name ? 'PUT' : 'POST', path, body);
    announce(`Saved ${body.name}${version ? `: version ${version}` : ''}`);
    location.hash = then(body.name);
  } catch (error) {
    showProblem(form, summary, error, collection, name || body.name, prefix);
  }
}

/// A read-only session that follows a link to a form sees it with every control disabled; the admin API still
/// decides, so a save forced past that is answered 403 and shown like any other problem.
function formShell(ctx, title, back, form, summary) {
  if (!ctx.canWrite) {
    const controls = [...form.childNodes];
    replace(form, h('fieldset', { class: 'read-only', id: 'read-only-fields', disabled: true },
      h('legend', {}, 'Read-only'), controls));
  }
  return h('section', {},
    h('p', {}, h('a', { href: back }, '← Back')),
    h('h1', {}, title),
    ctx.canWrite ? null : h('p', { class: 'notice warn', id: 'read-only-notice' }, READ_ONLY),
    summary,
    form);
}

// ---- APIs

export async function editApiPage(ctx, name) {
  const [original, upstreams] = await Promise.all([name ? get(itemPath('apis', name)) : Promise.resolve({}), listAll('upstreams')]);
  const summary = h('div', { class: 'notice bad problem', role: 'alert', tabindex: '-1', hidden: true, id: 'form-problem' });
  const form = h('form', { id: 'api-form', class: 'card', novalidate: true });
  const input = (value, attrs = {}) => h('input', { type: 'text', value: value ?? '', ...attrs });
  const nameInput = input(original.name, { name: 'name', required: true, readonly: name ? true : null, autocomplete: 'off' });
  const prefixInput = input(original.path_prefix ?? '/', { name: 'path_prefix' });
  const hostsInput = input((original.hosts || []).join(', '), { name: 'hosts' });
  const pathsInput = h('textarea', { name: 'paths', rows: 3 }, (original.paths || []).join('\n'));
  const methodsInput = input((original.methods || []).join(', '), { name: 'methods' });
  const upstreamSelect = h('select', { name: 'upstream' },
    h('option', { value: '' }, '— none (the bound spec\'s first server) —'),
    upstreams.map((upstream) => h('option', { value: upstream.name, selected: upstream.name === original.upstream }, upstream.name)));
  const strip = h('input', { type: 'checkbox', name: 'strip_prefix', checked: Boolean(original.strip_prefix) });
  const preserve = h('input', { type: 'checkbox', name: 'preserve_host', checked: Boolean(original.preserve_host) });
  const policies = h('textarea', { name: 'policies', rows: 6, class: 'code', spellcheck: 'false' },
    JSON.stringify(original.policies || [], null, 2));
  replace(form,
    field('api-name', 'Name', nameInput, name ? 'The name cannot change; delete and create to rename.' : 'Letters, digits, . _ @ -'),
    field('api-path_prefix', 'Path prefix', prefixInput, 'e.g. /shop/v2'),
    field('api-hosts', 'Hosts', hostsInput, 'Comma-separated; empty matches every host.'),
    field('api-paths', 'Paths', pathsInput, 'One per line, under the prefix (templates like /items/{id}); empty claims the whole prefix.'),
    field('api-methods', 'Methods', methodsInput, 'Comma-separated, e.g. GET, POST; empty matches every method.'),
    field('api-upstream', 'Upstream', upstreamSelect),
    field('api-strip_prefix', 'Strip the prefix before forwarding', strip),
    field('api-preserve_host', 'Forward the client\'s Host header', preserve),
    field('api-policies', 'Policies (JSON)', policies, 'A list such as [{"rate_limit": {"requests": 100, "per": "1m"}}], run in the gateway\'s fixed order.'),
    h('div', { class: 'actions' },
      h('button', { type: 'submit', class: 'primary', id: 'save' }, name ? 'Save changes' : 'Create API'),
      h('a', { class: 'button', href: name ? `#/apis/${encodeURIComponent(name)}` : '#/apis' }, 'Cancel')));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearErrors(form);
    summary.hidden = true;
    let parsedPolicies;
    try {
      parsedPolicies = parseJson(form, 'api-policies', policies.value, []);
    } catch {
      policies.focus();
      return;
    }
    const body = {
      ...original,
      name: nameInput.value.trim(),
      path_prefix: prefixInput.value.trim(),
      hosts: commaList(hostsInput.value),
      paths: lines(pathsInput.value),
      methods: commaList(methodsInput.value).map((method) => method.toUpperCase()),
      upstream: upstreamSelect.value,
      strip_prefix: strip.checked,
      preserve_host: preserve.checked,
      policies: parsedPolicies,
    };
    if (!body.upstream) delete body.upstream;
    await save(form, summary, 'apis', name, body, 'api', (saved) => `#/apis/${encodeURIComponent(saved)}`);
  });
  return formShell(ctx, name ? `Edit API ${name}` : 'New API', name ? `#/apis/${encodeURIComponent(name)}` : '#/edit', form, summary);
}

// ---- Upstreams

const BALANCERS = ['round_robin', 'weighted_round_robin', 'least_connections', 'random_two_choices', 'consistent_hash'];

export async function editUpstreamPage(ctx, name) {
  const original = name ? await get(itemPath('upstreams', name)) : {};
  const summary = h('div', { class: 'notice bad problem', role: 'alert', tabindex: '-1', hidden: true, id: 'form-problem' });
  const form = h('form', { id: 'upstream-form', class: 'card', novalidate: true });
  const input = (value, attrs = {}) => h('input', { type: 'text', value: value ?? '', ...attrs });
  const tlsSettings = original.tls || {};
  const nameInput = input(original.name, { name: 'name', required: true, readonly: name ? true : null, autocomplete: 'off' });
  const targets = h('textarea', { name: 'targets', rows: 4, class: 'code', spellcheck: 'false' },
    (original.targets || []).map((target) => (target.weight !== undefined && target.weight !== 1 ? `${target.url} ${target.weight}` : target.url)).join('\n'));
  const balance = h('select', { name: 'balance' },
    BALANCERS.map((value) => h('option', { value, selected: value === (original.balance || 'round_robin') }, value.replaceAll('_', ' '))));
  const http2 = h('input', { type: 'checkbox', name: 'http2', checked: Boolean(original.http2) });
  const healthPath = input(original.health_check?.path, { name: 'health_check' });
  const sni = input(tlsSettings.sni, { name: 'sni' });
  const skipVerify = h('input', { type: 'checkbox', name: 'insecure_skip_verify', checked: Boolean(tlsSettings.insecure_skip_verify) });
  const caBundle = h('textarea', { name: 'ca_bundle', rows: 4, class: 'code', spellcheck: 'false' }, tlsSettings.ca_bundle || '');
  const clientCertificate = input(tlsSettings.client_certificate, { name: 'client_certificate' });
  replace(form,
    field('upstream-name', 'Name', nameInput, name ? 'The name cannot change.' : 'Letters, digits, . _ @ -'),
    field('upstream-targets', 'Targets', targets, 'One per line: URL, then optionally a weight, e.g. http://10.0.0.5:8080 3'),
    field('upstream-balance', 'Balancer', balance),
    field('upstream-http2', 'Speak HTTP/2 to the targets', http2),
    field('upstream-health_check', 'Active health check path', healthPath, 'e.g. /health; empty: no active checks.'),
    h('fieldset', { class: 'tls' },
      h('legend', {}, 'TLS to https:// targets'),
      field('upstream-sni', 'SNI name', sni, 'Empty: the target\'s host.'),
      field('upstream-insecure_skip_verify', 'Do not verify the targets\' certificates', skipVerify),
      field('upstream-ca_bundle', 'CA bundle (PEM)', caBundle, 'Empty: the system roots.'),
      field('upstream-client_certificate', 'Client certificate (name)', clientCertificate, 'A certificate resource presented to the targets (mutual TLS).')),
    h('div', { class: 'actions' },
      h('button', { type: 'submit', class: 'primary', id: 'save' }, name ? 'Save changes' : 'Create upstream'),
      h('a', { class: 'button', href: '#/upstreams' }, 'Cancel')));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearErrors(form);
    summary.hidden = true;
    const body = { ...original, name: nameInput.value.trim(), balance: balance.value, http2: http2.checked };
    body.targets = lines(targets.value).map((line) => {
      const [url, weight] = line.split(/\s+/);
      return weight === undefined ? { url } : { url, weight: Number(weight) };
    });
    const path = healthPath.value.trim();
    if (path) body.health_check = { ...(original.health_check || {}), path };
    else delete body.health_check;
    const tls = {
      ...tlsSettings,
      sni: sni.value.trim() || undefined,
      insecure_skip_verify: skipVerify.checked,
      ca_bundle: caBundle.value.trim() ? caBundle.value : undefined,
      client_certificate: clientCertificate.value.trim() || undefined,
    };
    for (const key of Object.keys(tls)) if (tls[key] === undefined) delete tls[key];
    if (!tls.insecure_skip_verify) delete tls.insecure_skip_verify;
    if (Object.keys(tls).length) body.tls = tls;
    else delete body.tls;
    await save(form, summary, 'upstreams', name, body, 'upstream', () => '#/upstreams');
  });
  return formShell(ctx, name ? `Edit upstream ${name}` : 'New upstream', name ? '#/upstreams' : '#/edit', form, summary);
}
