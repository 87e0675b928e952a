// The dashboard's shell: sign-in, the session's role, navigation and the hash router that renders one page at a
// time into <main>. Pages live in pages.js, snapshots.js, traffic.js and edit.js.

import { ApiError, get, hasToken, setToken, whenSignedOut } from './api.js';
import { announce, append, h, replace } from './dom.js';
import { apiDetailPage, apisPage, consumersPage, overviewPage, upstreamsPage } from './pages.js';
import { diffPage, snapshotsPage } from './snapshots.js';
import { editApiPage, editPage, editUpstreamPage } from './edit.js';
import { trafficPage } from './traffic.js';

/// Who is signed in, from /v1/whoami: never taken from storage, so a role cannot be edited into the page.
const session = { name: null, role: null };

const PAGES = [
  { path: 'overview', label: 'Overview' },
  { path: 'apis', label: 'APIs' },
  { path: 'upstreams', label: 'Upstreams' },
  { path: 'consumers', label: 'Consumers' },
  { path: 'snapshots', label: 'Snapshots' },
  { path: 'traffic', label: 'Traffic' },
  { path: 'edit', label: 'Edit', admin: true },
];

let cleanups = [];

/// Context each page gets: whether it may write, and a way to run something periodically while it is shown.
function context() {
  return {
    canWrite: session.role === 'admin',
    role: session.role,
    every(ms, callback) {
      const id = setInterval(callback, ms);
      cleanups.push(() => clearInterval(id));
    },
  };
}

function route() {
  const hash = location.hash.startsWith('#/') ? location.hash.slice(2) : 'overview';
  const [path, query = ''] = hash.split('?');
  return { parts: path.split('/').filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(query) };
}

function pageFor({ parts, query }) {
  const [first = 'overview', second, third] = parts;
  switch (first) {
    case 'overview': return overviewPage;
    case 'apis': return second ? (ctx) => apiDetailPage(ctx, second) : apisPage;
    case 'upstreams': return upstreamsPage;
    case 'consumers': return consumersPage;
    case 'traffic': return trafficPage;
    case 'snapshots':
      if (second === 'diff') return (ctx) => diffPage(ctx, query.get('a'), query.get('b'));
      return snapshotsPage;
    case 'edit':
      if (second === 'api') return (ctx) => editApiPage(ctx, third === 'new' ? null : third);
      if (second === 'upstream') return (ctx) => editUpstreamPage(ctx, third === 'new' ? null : third);
      return editPage;
    default: return null;
  }
}

async function render() {
  for (const cleanup of cleanups) cleanup();
  cleanups = [];
  const main = document.getElementById('main');
  if (!hasToken() || !session.role) {
    renderSignIn();
    return;
  }
  const current = route();
  renderNav(current.parts[0] || 'overview');
  const page = pageFor(current);
  replace(main, h('p', { class: 'loading' }, 'Loading…'));
  let content;
  try {
    content = page ? await page(context()) : notFound();
  } catch (error) {
    content = errorPanel(error);
  }
  // A newer navigation may have rendered meanwhile; only the latest one's content is shown.
  if (route().parts.join('/') !== current.parts.join('/')) return;
  replace(main, content);
  const heading = main.querySelector('h1');
  if (heading) {
    heading.setAttribute('tabindex', '-1');
    heading.focus();
    document.title = `${heading.textContent} · Sluice`;
  }
}

function notFound() {
  return h('section', {}, h('h1', {}, 'Not found'), h('p', {}, 'No such page. ', h('a', { href: '#/overview' }, 'Go to the overview.')));
}

/// An error from the API as a page: its status and problem, e.g. a read-only token's 403.
export function errorPanel(error) {
  const problem = error instanceof ApiError ? error.problem : null;
  return h('section', { class: 'error-panel', role: 'alert' },
    h('h1', {}, problem?.title || 'Something went wrong'),
    h('p', {}, error instanceof ApiError && error.status ? `HTTP ${error.status}: ` : '', error.message || String(error)));
}

function renderNav(active) {
  const nav = document.getElementById('nav');
  nav.hidden = false;
  const links = PAGES.filter((page) => !page.admin || session.role === 'admin').map((page) =>
    h('li', {}, h('a', { href: `#/${page.path}`, 'aria-current': page.path === active ? 'page' : null }, page.label)));
  replace(nav, h('ul', {}, links));
  const who = document.getElementById('session');
  replace(who,
    h('span', { class: 'who' }, session.name, ' ',
      h('span', { class: `badge ${session.role === 'admin' ? 'ok' : 'muted'}`, 'data-role': session.role },
        session.role === 'admin' ? 'admin' : 'read-only')),
    h('button', { type: 'button', id: 'sign-out', onclick: signOut }, 'Sign out'));
}

function renderSignIn(message) {
  document.getElementById('nav').hidden = true;
  replace(document.getElementById('session'));
  const error = h('p', { id: 'sign-in-error', class: 'field-error', role: 'alert' }, message || '');
  const input = h('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false',
    'aria-describedby': 'token-help sign-in-error',
  });
  const form = h('form', { id: 'sign-in', class: 'card narrow' },
    h('h1', {}, 'Sign in'),
    h('label', { for: 'token' }, 'Admin token'),
    input,
    h('p', { id: 'token-help', class: 'help' },
      'An admin or read-only token (sluice-cp tokens create). It is kept in this tab only and sent to this control plane only.'),
    error,
    h('button', { type: 'submit', class: 'primary' }, 'Sign in'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (!value) return;
    setToken(value);
    try {
      await loadSession();
      input.value = '';
      // A new hash renders through the hashchange listener; the same one is rendered here.
      if (!location.hash.startsWith('#/')) location.hash = '#/overview';
      else await render();
    } catch (failure) {
      setToken(null);
      session.role = null;
      const refused = failure instanceof ApiError && failure.status === 401;
      replace(error, refused ? 'The control plane refused this token.' : failure.message);
      input.setAttribute('aria-invalid', 'true');
      input.focus();
    }
  });
  replace(document.getElementById('main'), form);
  document.title = 'Sign in · Sluice';
  input.focus();
}

async function loadSession() {
  const me = await get('/v1/whoami');
  session.name = me?.name || '';
  session.role = me?.role === 'admin' ? 'admin' : 'read-only';
}

function signOut() {
  setToken(null);
  session.name = null;
  session.role = null;
  announce('Signed out');
  renderSignIn();
}

whenSignedOut((message) => {
  // While signing in, the sign-in form reports the refusal itself.
  if (!session.role) return;
  session.role = null;
  renderSignIn(message);
});

async function start() {
  if (hasToken()) {
    try {
      await loadSession();
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 401)) {
        append(document.getElementById('main'), errorPanel(error));
        return;
      }
    }
  }
  window.addEventListener('hashchange', () => {
    // In-page anchors (the skip link) are not routes.
    if (location.hash.startsWith('#/') || location.hash === '') render();
  });
  await render();
}

start();
