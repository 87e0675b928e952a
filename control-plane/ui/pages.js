// The read pages: Overview (data planes, current version, counts), APIs and one API, Upstreams, Consumers. Each
// is an async function of the page context returning the page's element.

import { ApiError, get, itemPath, listAll, request } from './api.js';
import { announce, badge, confirmDialog, h, jsonBlock, replace, shortHash, table, when } from './dom.js';

const REFRESH_MS = 5000;

// ---- Overview

export async function overviewPage(ctx) {
  const section = h('section', { 'aria-labelledby': 'overview-title' });
  const summary = h('div', { class: 'cards', id: 'overview-summary' });
  const planes = h('div', { id: 'data-planes' });
  replace(section,
    h('h1', { id: 'overview-title' }, 'Overview'),
    summary,
    h('h2', {}, 'Data planes'),
    planes);
  const refresh = async () => {
    const [ready, snapshots, nodes, apis, upstreams, consumers] = await Promise.all([
      get('/readyz'),
      get('/v1/snapshots?limit=1'),
      get('/v1/data-planes'),
      listAll('apis'),
      listAll('upstreams'),
      listAll('consumers'),
    ]);
    const latest = snapshots?.items?.[0];
    const current = ready?.version ?? latest?.version ?? null;
    const items = nodes?.items || [];
    const connected = items.filter((node) => node.connected && !node.stale);
    const onCurrent = connected.filter((node) => node.applied_version === current);
    replace(summary,
      card('Current version', current ?? '—', latest && latest.version === current
        ? [latest.note, latest.author ? ` by ${latest.author}` : '', ' · ', when(latest.created_at)] : null, 'current-version'),
      card('Data planes', `${connected.length} connected`, `${onCurrent.length} on version ${current ?? '—'}, ${items.length} known`, 'count-data-planes'),
      card('APIs', apis.length, h('a', { href: '#/apis' }, 'List'), 'count-apis'),
      card('Upstreams', upstreams.length, h('a', { href: '#/upstreams' }, 'List'), 'count-upstreams'),
      card('Consumers', consumers.length, h('a', { href: '#/consumers' }, 'List'), 'count-consumers'));
    replace(planes, dataPlanesTable(items, current));
  };
  await refresh();
  // Data planes come and go on their own; the table follows without a reload. A failed refresh keeps the last one.
  ctx.every(REFRESH_MS, () => refresh().catch(() => {}));
  return section;
}

function card(title, value, detail, id) {
  return h('div', { class: 'card stat', id },
    h('h2', {}, title),
    h('p', { class: 'value' }, String(value)),
    detail ? h('p', { class: 'detail' }, detail) : null);
}

function dataPlanesTable(nodes, current) {
  if (!nodes.length) return h('p', {}, 'No data plane has connected yet.');
  const rows = nodes.map((node) => h('tr', { 'data-node': node.node_id },
    h('th', { scope: 'row' }, node.node_id),
    h('td', {}, node.hostname),
    h('td', {}, node.address),
    h('td', {}, node.software_version, h('span', { class: 'muted' }, ` (protocol ${node.protocol_version})`)),
    h('td', {}, versionCell(node, current)),
    h('td', { class: 'sync' }, syncCell(node)),
    h('td', {}, when(node.last_seen)),
    h('td', {}, stateCell(node))));
  return table('Data planes known to this control plane, by node id',
    ['Node', 'Host', 'Address', 'Software', 'Runs version', 'Last answer', 'Last seen', 'State'], rows,
    { id: 'data-planes-table' });
}

function versionCell(node, current) {
  if (node.applied_version === null || node.applied_version === undefined) return badge('none', 'muted');
  const text = `v${node.applied_version}`;
  return node.applied_version === current
    ? [badge(text, 'ok'), h('span', { class: 'muted' }, ` ${shortHash(node.applied_hash)}`)]
    : [badge(text, 'warn'), ' behind'];
}

/// ACK of the running version, or the NACK and its reason while it stands (the control plane clears it once a
/// newer snapshot is accepted).
function syncCell(node) {
  const nacked = node.last_nack_version !== null && node.last_nack_version !== undefined
    && (node.last_ack_version === null || node.last_ack_version === undefined || node.last_nack_version > node.last_ack_version);
  if (nacked || node.last_error) {
    return h('div', { class: 'nack' },
      badge(`NACK v${node.last_nack_version ?? '?'}`, 'bad'),
      node.last_error ? h('p', { class: 'reason' }, node.last_error) : null);
  }
  if (node.last_ack_version !== null && node.last_ack_version !== undefined) return badge(`ACK v${node.last_ack_version}`, 'ok');
  return badge('no answer yet', 'muted');
}

function stateCell(node) {
  if (node.stale) return badge('stale', 'bad');
  return node.connected ? badge('connected', 'ok') : badge('disconnected', 'warn');
}

// ---- APIs

/// The policy names of an API, in its order (each policy is `{ "<kind>": { ... } }`).
export function policyNames(api) {
  return (api.policies || []).map((policy) => Object.keys(policy)[0]).filter(Boolean);
}

function route(api) {
  const hosts = api.hosts?.length ? api.hosts.join(', ') : '*';
  const paths = api.paths?.length ? api.paths.map((path) => `${api.path_prefix}${path}`).join(', ') : `${api.path_prefix}…`;
  return `${hosts} ${paths}`;
}

export async function apisPage(ctx) {
  const apis = await listAll('apis');
  const rows = apis.map((api) => h('tr', { 'data-api': api.name },
    h('th', { scope: 'row' }, h('a', { href: `#/apis/${encodeURIComponent(api.name)}` }, api.name)),
    h('td', {}, h('code', {}, route(api))),
    h('td', {}, api.methods?.length ? api.methods.join(', ') : 'any'),
    h('td', {}, api.upstream || (api.openapi ? `spec ${api.openapi.spec} servers[0]` : '—')),
    h('td', {}, policyNames(api).length ? policyNames(api).join(', ') : h('span', { class: 'muted' }, 'none')),
    h('td', {}, api.openapi ? `${api.openapi.spec}${api.openapi.validate_requests ? ' (validates requests)' : ''}` : '—')));
  return h('section', {},
    h('div', { class: 'title-row' },
      h('h1', {}, 'APIs'),
      ctx.canWrite ? h('a', { class: 'button primary', href: '#/edit/api/new', id: 'new-api' }, 'New API') : null),
    apis.length
      ? table(`${apis.length} APIs, by name`, ['Name', 'Route (hosts, paths)', 'Methods', 'Upstream', 'Policies', 'OpenAPI'], rows, { id: 'apis-table' })
      : h('p', {}, 'No APIs yet.'));
}

export async function apiDetailPage(ctx, name) {
  const api = await get(itemPath('apis', name));
  const facts = [
    ['Hosts', api.hosts?.length ? api.hosts.join(', ') : 'any host'],
    ['Path prefix', h('code', {}, api.path_prefix)],
    ['Paths', api.paths?.length ? api.paths.join(', ') : 'the whole prefix'],
    ['Methods', api.methods?.length ? api.methods.join(', ') : 'any'],
    ['Upstream', api.upstream ? h('a', { href: '#/upstreams' }, api.upstream) : '—'],
    ['Strip prefix', api.strip_prefix ? 'yes' : 'no'],
    ['Preserve host', api.preserve_host ? 'yes' : 'no'],
    ['OpenAPI', api.openapi ? `${api.openapi.spec}, requests ${api.openapi.validate_requests ? '' : 'not '}validated` : '—'],
    ['Timeouts', `connect ${api.connect_timeout || 'default'}, request ${api.request_timeout || 'default'}, retries ${api.retries ?? 'default'}`],
  ];
  const policies = (api.policies || []).map((policy, index) => {
    const [kind] = Object.keys(policy);
    return h('li', {}, h('h3', {}, `${index + 1}. ${kind}`), jsonBlock(policy[kind], `${kind} settings`));
  });
  const actions = ctx.canWrite ? h('div', { class: 'actions' },
    h('a', { class: 'button', href: `#/edit/api/${encodeURIComponent(api.name)}`, id: 'edit-api' }, 'Edit'),
    h('button', { type: 'button', class: 'danger', id: 'delete-api', onclick: () => deleteResource('apis', api.name, '#/apis') }, 'Delete')) : null;
  return h('section', {},
    h('p', {}, h('a', { href: '#/apis' }, '← APIs')),
    h('div', { class: 'title-row' }, h('h1', {}, `API ${api.name}`), actions),
    h('dl', { class: 'facts' }, facts.map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)])),
    h('h2', {}, 'Policies'),
    policies.length ? h('ol', { class: 'policies' }, policies) : h('p', {}, 'No policies: every request is forwarded.'),
    h('h2', {}, 'Configuration'),
    jsonBlock(api, `Configuration of API ${api.name}`));
}

/// Deletes after a confirmation; a 409 names who still refers to it.
export async function deleteResource(collection, name, then) {
  const what = collection === 'apis' ? 'API' : 'upstream';
  const confirmed = await confirmDialog(`Delete ${what} ${name}?`,
    `This commits a new configuration version without ${what} ${name}; data planes stop serving it.`, 'Delete');
  if (!confirmed) return;
  try {
    const { version } = await request('DELETE', itemPath(collection, name));
    announce(`Deleted ${what} ${name}${version ? `: version ${version}` : ''}`);
    if (location.hash === then) window.dispatchEvent(new HashChangeEvent('hashchange'));
    else location.hash = then;
  } catch (error) {
    const referrers = error instanceof ApiError && error.problem?.referrers?.length
      ? ` Still used by: ${error.problem.referrers.join(', ')}.` : '';
    await confirmDialog(`${what} ${name} was not deleted`, `${error.message}.${referrers}`, 'OK', false);
  }
}

// ---- Upstreams

export async function upstreamsPage(ctx) {
  const [upstreams, apis] = await Promise.all([listAll('upstreams'), listAll('apis')]);
  const usedBy = (name) => apis.filter((api) => api.upstream === name).map((api) => api.name);
  /// The health cell of each target, by `upstream target-url`, filled by refreshHealth.
  const healthCells = new Map();
  const sections = upstreams.map((upstream) => {
    const id = `upstream-${upstream.name}`;
    const users = usedBy(upstream.name);
    const hc = upstream.health_check;
    const passive = upstream.passive_health_check;
    const rows = (upstream.targets || []).map((target) => {
      const url = targetKey(target.url);
      const cell = h('td', { class: 'health' }, badge('no report yet', 'muted'));
      healthCells.set(`${upstream.name} ${url}`, cell);
      return h('tr', { 'data-target': url },
        h('th', { scope: 'row' }, h('code', {}, target.url)),
        h('td', {}, String(target.weight ?? 1)),
        cell);
    });
    return h('article', { class: 'card upstream', 'aria-labelledby': id, 'data-upstream': upstream.name },
      h('div', { class: 'title-row' },
        h('h2', { id }, upstream.name),
        ctx.canWrite ? h('div', { class: 'actions' },
          h('a', { class: 'button', href: `#/edit/upstream/${encodeURIComponent(upstream.name)}` }, 'Edit'),
          h('button', { type: 'button', class: 'danger', onclick: () => deleteResource('upstreams', upstream.name, '#/upstreams') }, 'Delete')) : null),
      h('dl', { class: 'facts' },
        h('dt', {}, 'Balancer'), h('dd', {}, balance(upstream)),
        h('dt', {}, 'Protocol'), h('dd', {}, upstream.http2 ? 'HTTP/2' : 'HTTP/1.1'),
        h('dt', {}, 'TLS'), h('dd', {}, tls(upstream)),
        h('dt', {}, 'Health checks'), h('dd', {},
          hc ? `active: GET ${hc.path} every ${hc.interval}, timeout ${hc.timeout}, up after ${hc.healthy_threshold}, down after ${hc.unhealthy_threshold}` : 'no active checks',
          passive ? `; passive: eject for ${passive.ejection} after ${passive.consecutive_failures} failures in a row` : ''),
        h('dt', {}, 'Used by'), h('dd', {}, users.length ? users.map((name, i) => [i ? ', ' : '', h('a', { href: `#/apis/${encodeURIComponent(name)}` }, name)]) : 'no API')),
      table(`Targets of ${upstream.name}, with their health as the data planes report it`, ['URL', 'Weight', 'Health (data planes)'], rows));
  });
  const refreshHealth = async () => {
    const reports = (await get('/v1/upstream-health'))?.items || [];
    const byTarget = new Map(reports.map((report) => [`${report.upstream} ${targetKey(report.url)}`, report]));
    for (const [key, cell] of healthCells) {
      const report = byTarget.get(key);
      cell.closest('tr').dataset.health = healthState(report);
      replace(cell, healthCell(report));
    }
  };
  await refreshHealth();
  // Targets go down and come back on their own; the cells follow. A failed refresh keeps the last figures.
  ctx.every(REFRESH_MS, () => refreshHealth().catch(() => {}));
  return h('section', {},
    h('div', { class: 'title-row' },
      h('h1', {}, 'Upstreams'),
      ctx.canWrite ? h('a', { class: 'button primary', href: '#/edit/upstream/new' }, 'New upstream') : null),
    h('p', { class: 'help' }, 'Health is what each connected data plane saw at its last heartbeat: ejected by the passive check, failing the active check, or healthy.'),
    sections.length ? sections : h('p', {}, 'No upstreams yet.'));
}

/// Data planes report a target's URL without a trailing slash.
function targetKey(url) {
  return String(url).replace(/\/+$/, '');
}

const STATE_LABELS = { healthy: 'healthy', ejected: 'ejected', failing_active_check: 'failing active check' };

/// healthy (every reporting data plane), down (none), degraded (some), unknown (no report).
function healthState(report) {
  if (!report || !(report.healthy + report.unhealthy)) return 'unknown';
  if (!report.unhealthy) return 'healthy';
  return report.healthy ? 'degraded' : 'down';
}

function healthCell(report) {
  const state = healthState(report);
  if (state === 'unknown') return [badge('no report', 'muted'), h('span', { class: 'muted' }, ' no connected data plane runs this target')];
  const planes = report.healthy + report.unhealthy;
  const summary = {
    healthy: badge('healthy', 'ok'),
    degraded: badge('degraded', 'warn'),
    down: badge('down', 'bad'),
  }[state];
  const unhealthy = report.data_planes.filter((plane) => plane.state !== 'healthy');
  return [
    summary,
    ` ${report.healthy} of ${planes} data plane${planes === 1 ? '' : 's'} healthy`,
    unhealthy.length ? h('ul', { class: 'plain' }, unhealthy.map((plane) =>
      h('li', { 'data-node': plane.node_id }, `${plane.node_id}: ${STATE_LABELS[plane.state] || plane.state}`))) : null,
  ];
}

function balance(upstream) {
  const name = (upstream.balance || 'round_robin').replaceAll('_', ' ');
  const on = upstream.hash_on;
  return on ? `${name} on ${on.source.replaceAll('_', ' ')}${on.name ? ` ${on.name}` : ''}` : name;
}

function tls(upstream) {
  const settings = upstream.tls;
  const https = (upstream.targets || []).some((target) => target.url.startsWith('https://'));
  if (!settings) return https ? 'https targets, system roots' : 'none (plain HTTP targets)';
  const parts = [
    settings.insecure_skip_verify ? 'certificates NOT verified' : (settings.ca_bundle ? 'verified against its own CA bundle' : 'verified against the system roots'),
  ];
  if (settings.sni) parts.push(`SNI ${settings.sni}`);
  if (settings.client_certificate) parts.push(`client certificate ${settings.client_certificate}`);
  return parts.join(', ');
}

// ---- Consumers

/// What kinds of credential a consumer has; the credentials themselves (hashes, sealed values) are never shown.
export function credentialKinds(consumer) {
  const kinds = [];
  if (consumer.basic_auth) kinds.push('basic auth');
  if (consumer.api_keys?.length) kinds.push(`API key${consumer.api_keys.length > 1 ? `s (${consumer.api_keys.length})` : ''}`);
  for (const jwt of consumer.jwt || []) kinds.push(`JWT ${jwt.algorithm} (key id ${jwt.key})`);
  return kinds;
}

export async function consumersPage() {
  const consumers = await listAll('consumers');
  const rows = consumers.map((consumer) => h('tr', { 'data-consumer': consumer.username },
    h('th', { scope: 'row' }, consumer.username),
    h('td', {}, credentialKinds(consumer).join(', ') || h('span', { class: 'muted' }, 'none'))));
  return h('section', {},
    h('h1', {}, 'Consumers'),
    h('p', { class: 'help' }, 'Credentials are write-only: set them with the admin API or sluice apply; they are never shown.'),
    consumers.length ? table(`${consumers.length} consumers, by name`, ['Username', 'Credentials'], rows, { id: 'consumers-table' }) : h('p', {}, 'No consumers yet.'));
}
