// The Traffic page: requests/s, error rate and p99 latency per API over the last 15 minutes, from the summaries the
// data planes send with their heartbeats (GET /v1/traffic, added up over the data planes), drawn as inline SVG.
// Nothing is told by the drawing alone: each chart has a text label with its latest and highest value, the figures
// beside it, and a table of every point behind a disclosure.

import { get } from './api.js';
import { h, replace, svg, table, time } from './dom.js';

const REFRESH_MS = 5000;

/// The three charts of an API: which field of a point, its label, and how a value reads.
const METRICS = [
  { key: 'requests_per_second', label: 'Requests/s', format: (v) => `${fixed(v)} req/s` },
  { key: 'error_rate', label: 'Error rate (5xx)', format: (v) => `${fixed(v * 100)} %` },
  { key: 'p99_ms', label: 'p99 latency', format: (v) => `${fixed(v)} ms` },
];

const WIDTH = 320;
const HEIGHT = 120;
const PAD = { left: 44, right: 8, top: 10, bottom: 20 };

function fixed(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return '—';
  if (value >= 100) return value.toFixed(0);
  return value >= 10 ? value.toFixed(1) : value.toFixed(2);
}

export async function trafficPage(ctx) {
  const body = h('div', { id: 'traffic' });
  const sources = h('p', { class: 'help', id: 'traffic-sources' });
  // Every data plane added up, or one of them alone.
  const select = h('select', { id: 'traffic-source', name: 'source' }, h('option', { value: '' }, 'All data planes'));
  let known = [];
  const refresh = async () => {
    const all = await get('/v1/traffic');
    const planes = all?.data_planes || [];
    if (planes.join('\n') !== known.join('\n')) {
      // Rebuilt only when the set changes, so a list the operator has open is not replaced under the pointer.
      const chosen = select.value;
      known = planes;
      replace(select, h('option', { value: '' }, 'All data planes'),
        planes.map((node) => h('option', { value: node, selected: node === chosen }, node)));
    }
    const node = select.value;
    const data = node ? (await get(`/v1/data-planes/${encodeURIComponent(node)}/telemetry`))?.traffic : all;
    // A refresh rebuilds the charts; keyboard focus stays on the chart it was on.
    const focused = document.activeElement?.id;
    renderTraffic(body, sources, data, node);
    if (focused) document.getElementById(focused)?.focus();
  };
  select.addEventListener('change', () => refresh().catch(() => {}));
  await refresh();
  ctx.every(REFRESH_MS, () => refresh().catch(() => {}));
  return h('section', { 'aria-labelledby': 'traffic-title' },
    h('div', { class: 'title-row' },
      h('h1', { id: 'traffic-title' }, 'Traffic'),
      h('div', { class: 'field inline' }, h('label', { for: 'traffic-source' }, 'Data plane'), select)),
    sources,
    body);
}

function renderTraffic(body, sources, data, node) {
  const planes = data?.data_planes || [];
  const minutes = Math.round((data?.window_seconds || 900) / 60);
  const from = node
    ? `from data plane ${node} alone`
    : `added up over ${planes.length} data plane${planes.length === 1 ? '' : 's'} (${planes.join(', ')})`;
  replace(sources,
    planes.length
      ? `Last ${minutes} minutes, in ${data.slot_seconds}-second steps, ${from}, as the heartbeats reported it.`
      : `No data plane connected to this control plane reported traffic in the last ${minutes} minutes.`,
    data?.apis_omitted ? ` The data planes left ${data.apis_omitted} quieter API entries out of their reports.` : '');
  const apis = data?.apis || [];
  if (!apis.length) {
    replace(body, h('p', { id: 'no-traffic' }, 'No requests in this window.'));
    return;
  }
  const slotMs = (data.slot_seconds || 10) * 1000;
  const last = data.slots.length ? data.slots[data.slots.length - 1] + slotMs : Date.now();
  const range = { from: last - (data.window_seconds || 900) * 1000, to: last, slotMs };
  replace(body, apis.map((api) => apiCard(api, range)));
}

function apiCard(api, range) {
  const id = `traffic-${api.api}`;
  const rate = api.requests ? api.errors / api.requests : 0;
  return h('article', { class: 'card traffic', 'aria-labelledby': `${id}-title`, 'data-api': api.api, id },
    h('div', { class: 'title-row' },
      h('h2', { id: `${id}-title` }, api.api),
      h('p', { class: 'totals' },
        h('span', { 'data-figure': 'requests' }, String(api.requests)), ' requests, ',
        h('span', { 'data-figure': 'errors' }, String(api.errors)), ` errors (${fixed(rate * 100)} %) in the window`)),
    h('div', { class: 'charts' }, METRICS.map((metric) => chart(api, metric, range))),
    h('details', {},
      h('summary', {}, `Figures of ${api.api}`),
      table(`Every step of ${api.api}, oldest first`, ['Step start (UTC)', 'Requests', 'Errors', 'Requests/s', 'Error rate', 'p99'],
        api.points.map((point) => [time(point.at), String(point.requests), String(point.errors),
          ...METRICS.map((metric) => metric.format(point[metric.key]))]))));
}

/// One line chart: x is time over the window, y from 0 to the highest value. A point without a value (p99 with
/// no requests) breaks the line.
function chart(api, metric, range) {
  const id = `chart-${api.api}-${metric.key}`;
  const points = api.points.map((point) => ({ at: point.at + range.slotMs / 2, value: point[metric.key] }));
  const values = points.map((point) => point.value).filter((value) => value !== null && value !== undefined);
  const latest = points.length ? points[points.length - 1].value : null;
  const highest = values.length ? Math.max(...values) : 0;
  const top = highest > 0 ? highest * 1.1 : 1;
  const x = (at) => PAD.left + ((at - range.from) / (range.to - range.from)) * (WIDTH - PAD.left - PAD.right);
  const y = (value) => HEIGHT - PAD.bottom - (value / top) * (HEIGHT - PAD.top - PAD.bottom);

  const segments = [];
  let current = [];
  for (const point of points) {
    if (point.value === null || point.value === undefined) {
      if (current.length) segments.push(current);
      current = [];
    } else {
      current.push(`${x(point.at).toFixed(1)},${y(point.value).toFixed(1)}`);
    }
  }
  if (current.length) segments.push(current);

  const label = `${metric.label} of ${api.api} over the window: latest ${metric.format(latest)}, highest ${metric.format(values.length ? highest : null)}.`;
  const minutes = Math.round((range.to - range.from) / 60000);
  const drawing = svg('svg', {
    id, class: 'chart', viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: 'img', 'aria-label': label, tabindex: 0,
    'data-points': points.filter((p) => p.value !== null && p.value !== undefined).length,
  },
  svg('line', { class: 'axis', x1: PAD.left, y1: HEIGHT - PAD.bottom, x2: WIDTH - PAD.right, y2: HEIGHT - PAD.bottom }),
  svg('line', { class: 'axis', x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: HEIGHT - PAD.bottom }),
  svg('text', { class: 'tick', x: PAD.left - 4, y: PAD.top + 8, 'text-anchor': 'end' }, fixed(top)),
  svg('text', { class: 'tick', x: PAD.left - 4, y: HEIGHT - PAD.bottom, 'text-anchor': 'end' }, '0'),
  // A faint line every 5 minutes, so a point's age can be read off.
  Array.from({ length: Math.max(0, Math.floor(minutes / 5) - 1) }, (_, i) => {
    const gx = x(range.to - (i + 1) * 5 * 60000).toFixed(1);
    return svg('line', { class: 'grid', x1: gx, y1: PAD.top, x2: gx, y2: HEIGHT - PAD.bottom });
  }),
  svg('text', { class: 'tick', x: PAD.left, y: HEIGHT - 4 }, `−${minutes} min`),
  svg('text', { class: 'tick', x: WIDTH - PAD.right, y: HEIGHT - 4, 'text-anchor': 'end' }, 'now'),
  segments.map((segment) => svg('polyline', { class: 'line', points: segment.join(' ') })),
  points.filter((point) => point.value !== null && point.value !== undefined).map((point) =>
    svg('circle', { class: 'point', cx: x(point.at).toFixed(1), cy: y(point.value).toFixed(1), r: 2.5, 'data-value': point.value },
      svg('title', {}, `${time(point.at - range.slotMs / 2)}: ${metric.format(point.value)}`))));
  return h('figure', { class: 'chart', 'data-metric': metric.key },
    h('figcaption', {}, metric.label, ' ', h('span', { class: 'latest', 'data-latest': metric.key }, metric.format(latest))),
    drawing);
}
