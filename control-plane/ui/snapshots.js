// Snapshot history: who changed what and when, a side-by-side comparison of any two versions, and rollback (which
// commits the old configuration as a new version) after a confirmation.

import { ApiError, get, request } from './api.js';
import { HIDDEN, announce, badge, confirmDialog, h, isSecretField, replace, shortHash, table, time, when } from './dom.js';

const PAGE = 50;

export async function snapshotsPage(ctx) {
  const section = h('section', {});
  const list = h('div', {});
  const message = h('div', { id: 'snapshot-message', role: 'status' });
  const older = h('button', { type: 'button', id: 'older', hidden: true }, 'Older versions');
  const snapshots = [];
  let current = null;
  let next = null;

  const form = h('form', { id: 'compare', class: 'compare' });
  const draw = () => {
    // Redrawn when older versions are added: keep what was picked.
    const picked = new FormData(form);
    const isPicked = (column, version, index, fallback) =>
      picked.has(column) ? picked.get(column) === String(version) : index === fallback;
    const rows = snapshots.map((snapshot, index) => h('tr', { 'data-version': snapshot.version },
      h('th', { scope: 'row' }, `v${snapshot.version}`, snapshot.version === current ? [' ', badge('current', 'ok')] : null),
      h('td', {}, h('input', {
        type: 'radio', name: 'a', value: snapshot.version, id: `a-${snapshot.version}`,
        'aria-label': `Compare from version ${snapshot.version}`, checked: isPicked('a', snapshot.version, index, 1),
      })),
      h('td', {}, h('input', {
        type: 'radio', name: 'b', value: snapshot.version, id: `b-${snapshot.version}`,
        'aria-label': `Compare to version ${snapshot.version}`, checked: isPicked('b', snapshot.version, index, 0),
      })),
      h('td', {}, snapshot.note),
      h('td', {}, snapshot.author || h('span', { class: 'muted' }, 'control plane')),
      h('td', {}, when(snapshot.created_at), h('span', { class: 'muted' }, ` ${time(snapshot.created_at)}`)),
      h('td', {}, h('code', {}, shortHash(snapshot.hash))),
      h('td', {}, `${snapshot.size_bytes} B`),
      ctx.canWrite ? h('td', {}, snapshot.version === current ? '' : h('button', {
        type: 'button', class: 'rollback', 'data-rollback': snapshot.version,
        onclick: () => rollback(snapshot.version),
      }, `Roll back to v${snapshot.version}`)) : null));
    const headers = ['Version', 'A', 'B', 'Change', 'By', 'When', 'Hash', 'Size'];
    if (ctx.canWrite) headers.push('Rollback');
    replace(list, table('Snapshot history, newest first. Pick A and B to compare two versions.', headers, rows, { id: 'snapshots-table' }));
    older.hidden = !next;
  };

  const load = async () => {
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (next) query.set('before', String(next));
    const page = await get(`/v1/snapshots?${query}`);
    if (current === null) current = page?.items?.[0]?.version ?? null;
    snapshots.push(...(page?.items || []));
    next = page?.next ?? null;
    draw();
  };

  const rollback = async (version) => {
    const confirmed = await confirmDialog(`Roll back to version ${version}?`,
      `This commits the configuration of version ${version} as a new version and pushes it to every data plane. `
      + 'Nothing is lost: the versions after it stay in the history.', `Roll back to v${version}`);
    if (!confirmed) return;
    try {
      const { data } = await request('POST', `/v1/snapshots/${version}/rollback`);
      const text = data?.changed
        ? `Rolled back to version ${version}: now version ${data.version}.`
        : `The configuration already equals version ${version}; nothing committed.`;
      snapshots.length = 0;
      current = null;
      next = null;
      await load();
      replace(message, h('p', { class: 'notice ok' }, text));
      announce(text);
    } catch (error) {
      replace(message, problemNotice(error));
    }
  };

  older.addEventListener('click', () => load().catch((error) => replace(message, problemNotice(error))));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const a = data.get('a');
    const b = data.get('b');
    if (a && b) location.hash = `#/snapshots/diff?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`;
  });
  replace(form, list, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary', id: 'compare-button' }, 'Compare A with B'), older));
  replace(section, h('h1', {}, 'Snapshots'), message, form);
  await load();
  return section;
}

function problemNotice(error) {
  const status = error instanceof ApiError && error.status ? `HTTP ${error.status}: ` : '';
  return h('p', { class: 'notice bad', role: 'alert' }, status, error.message);
}

// ---- Diff

/// Flattens a configuration into `path → value` lines. List items are named by their name (or username), so an
/// insertion does not show every later item as changed.
export function flatten(value, prefix = '', out = new Map()) {
  if (Array.isArray(value)) {
    if (!value.length) out.set(prefix, '[]');
    value.forEach((item, index) => {
      const name = item && typeof item === 'object' && !Array.isArray(item) ? (item.name ?? item.username) : undefined;
      flatten(item, `${prefix}/${typeof name === 'string' ? name : index}`, out);
    });
  } else if (value && typeof value === 'object') {
    const entries = Object.entries(value);
    if (!entries.length) out.set(prefix, '{}');
    for (const [key, inner] of entries) flatten(inner, `${prefix}/${key}`, out);
  } else {
    out.set(prefix, JSON.stringify(value));
  }
  return out;
}

/// One row per path present in either version. A secret's value is compared but never shown.
export function diffRows(left, right) {
  const a = flatten(left);
  const b = flatten(right);
  // An empty list on one side and items on the other: the items' rows say it all.
  const filledIn = (path, other) => [...other.keys()].some((key) => key.startsWith(`${path}/`));
  const paths = [...new Set([...a.keys(), ...b.keys()])].sort()
    .filter((path) => !((a.get(path) === '[]' || a.get(path) === '{}') && filledIn(path, b))
      && !((b.get(path) === '[]' || b.get(path) === '{}') && filledIn(path, a)));
  return paths.map((path) => {
    const secret = isSecretField(path.split('/').pop());
    const before = a.get(path);
    const after = b.get(path);
    const change = before === undefined ? 'added' : after === undefined ? 'removed' : before === after ? 'same' : 'changed';
    const show = (value) => (value === undefined ? '' : secret ? HIDDEN : value);
    return { path, change, before: show(before), after: show(after) };
  });
}

export async function diffPage(ctx, a, b) {
  const [left, right] = await Promise.all([get(`/v1/snapshots/${encodeURIComponent(a)}`), get(`/v1/snapshots/${encodeURIComponent(b)}`)]);
  const rows = diffRows(left.config, right.config);
  const changed = rows.filter((row) => row.change !== 'same');
  const body = h('tbody', {});
  const showAll = h('input', { type: 'checkbox', id: 'show-unchanged' });
  const draw = () => {
    const shown = showAll.checked ? rows : changed;
    replace(body, shown.length ? shown.map((row) => h('tr', { class: `diff-${row.change}`, 'data-path': row.path },
      h('th', { scope: 'row' }, h('code', {}, row.path)),
      h('td', { class: 'before' }, row.before),
      h('td', { class: 'after' }, row.after),
      h('td', {}, badge(row.change, { added: 'ok', removed: 'bad', changed: 'warn', same: 'muted' }[row.change]))))
      : h('tr', {}, h('td', { colspan: 4 }, 'The two versions hold the same configuration.')));
  };
  showAll.addEventListener('change', draw);
  draw();
  const heading = (snapshot) => `v${snapshot.version} · ${snapshot.note}${snapshot.author ? ` · ${snapshot.author}` : ''} · ${time(snapshot.created_at)}`;
  return h('section', {},
    h('p', {}, h('a', { href: '#/snapshots' }, '← Snapshots')),
    h('h1', {}, `Version ${left.version} → version ${right.version}`),
    h('p', { id: 'diff-summary' }, `${changed.length} ${changed.length === 1 ? 'difference' : 'differences'}. Secrets are compared but never shown.`),
    h('p', {}, h('label', { for: 'show-unchanged' }, showAll, ' Show unchanged settings')),
    h('table', { id: 'diff-table', class: 'diff' },
      h('caption', {}, 'Settings that differ, side by side'),
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Setting'),
        h('th', { scope: 'col' }, heading(left)),
        h('th', { scope: 'col' }, heading(right)),
        h('th', { scope: 'col' }, 'Change'))),
      body));
}
