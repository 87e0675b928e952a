// The admin API as the page sees it: every call carries the session's bearer token, errors come back as
// ApiError holding the RFC 9457 problem, and a 401 ends the session.

const TOKEN_KEY = 'sluice.dashboard.token';

let token = sessionStorage.getItem(TOKEN_KEY);
let onSignedOut = () => {};

export function hasToken() {
  return Boolean(token);
}

/// Keeps the token for this tab only (sessionStorage: gone when the tab closes, not shared with other tabs).
export function setToken(value) {
  token = value;
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function whenSignedOut(callback) {
  onSignedOut = callback;
}

export class ApiError extends Error {
  constructor(status, problem, text) {
    super(problem?.detail || problem?.title || text || `HTTP ${status}`);
    this.status = status;
    this.problem = problem && typeof problem === 'object' ? problem : null;
  }

  /// The problem's field errors: [{ pointer, detail }].
  get errors() {
    return Array.isArray(this.problem?.errors) ? this.problem.errors : [];
  }
}

/// Sends a request; resolves to { data, version } (version: the Sluice-Config-Version of a write).
export async function request(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
      redirect: 'error',
    });
  } catch (error) {
    throw new ApiError(0, { title: 'The control plane does not answer', detail: String(error.message || error) });
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    if (response.status === 401 && token) {
      setToken(null);
      onSignedOut('The token was refused (revoked or wrong); sign in again.');
    }
    throw new ApiError(response.status, data, text);
  }
  const version = Number(response.headers.get('Sluice-Config-Version')) || null;
  return { data, version };
}

export async function get(path) {
  return (await request('GET', path)).data;
}

/// Every item of a paged collection (`next` is passed back as `after`).
export async function listAll(collection) {
  const items = [];
  let after = null;
  for (;;) {
    const query = new URLSearchParams({ limit: '1000' });
    if (after) query.set('after', after);
    const page = await get(`/v1/${collection}?${query}`);
    items.push(...(page?.items || []));
    if (!page?.next) return items;
    after = page.next;
  }
}

/// Path segment of a resource name (names are restricted, but encode anyway).
export function itemPath(collection, name) {
  return `/v1/${collection}/${encodeURIComponent(name)}`;
}
