// Building the page: elements are made with createElement and filled with text nodes, never from HTML strings,
// so nothing the API returns can become markup. Secrets are hidden here, once, for every page.

const SVG_NS = 'http://www.w3.org/2000/svg';

function build(element, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      element.addEventListener(key.slice(2), value);
    } else if (value === true) {
      element.setAttribute(key, '');
    } else {
      element.setAttribute(key, String(value));
    }
  }
  append(element, children);
  return element;
}

/// Appends children: nodes as they are, strings and numbers as text, arrays flattened, null skipped.
export function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/// h('a', { href: '#/apis' }, 'APIs'): an HTML element.
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/// An SVG element, for the charts.
export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/// Replaces an element's content.
export function replace(element, ...children) {
  element.replaceChildren();
  return append(element, children);
}

/// Fields that hold a credential in stored form (hashes, sealed values) or, if one ever came back, in clear.
/// `key` is not among them: for a JWT credential it is the key id; API keys and certificate keys are write-only
/// and never returned.
const SECRET_FIELDS = new Set([
  'password', 'password_hash', 'key_digest', 'secret', 'secret_sealed', 'key_sealed', 'pkcs12', 'token',
]);
export const HIDDEN = '‹hidden›';

export function isSecretField(name) {
  return SECRET_FIELDS.has(name);
}

/// A deep copy with every secret field's value replaced by HIDDEN.
export function redact(value) {
  if (Array.isArray(value)) return value.map(redact);
  if (value && typeof value === 'object') {
    const out = {};
    for (const [key, inner] of Object.entries(value)) {
      out[key] = SECRET_FIELDS.has(key) ? HIDDEN : redact(inner);
    }
    return out;
  }
  return value;
}

/// Pretty JSON of a redacted value, as text in a <pre>.
export function jsonBlock(value, label) {
  return h('pre', { class: 'json', tabindex: 0, 'aria-label': label }, JSON.stringify(redact(value), null, 2));
}

export function time(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return '';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function ago(ms) {
  if (typeof ms !== 'number') return '';
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

/// A <time> showing "12 s ago" with the exact UTC time as its datetime and title.
export function when(ms) {
  if (typeof ms !== 'number') return '';
  return h('time', { datetime: new Date(ms).toISOString(), title: time(ms) }, ago(ms));
}

export function shortHash(hash) {
  return typeof hash === 'string' ? hash.slice(0, 12) : '';
}

/// A table with a caption and column headers; rows are arrays of cells (nodes or text).
export function table(caption, headers, rows, attrs = {}) {
  return h('table', attrs,
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, headers.map((header) => h('th', { scope: 'col' }, header)))),
    h('tbody', {}, rows.map((row) => row instanceof Node ? row : h('tr', {}, row.map((cell) => h('td', {}, cell))))));
}

/// A badge: text plus a class for its colour, so the state never depends on colour alone.
export function badge(text, kind) {
  return h('span', { class: `badge ${kind}` }, text);
}

/// Announces a message to screen readers and shows it in the status line.
export function announce(message) {
  const status = document.getElementById('status');
  if (status) replace(status, message);
}

/// A modal confirmation (native <dialog>: focus is trapped and Escape cancels). Resolves true on confirm.
/// Without `cancellable` it is a notice with one button.
export function confirmDialog(title, body, confirmLabel, cancellable = true) {
  return new Promise((resolve) => {
    const titleId = `dialog-title-${Math.random().toString(36).slice(2)}`;
    const dialog = h('dialog', { 'aria-labelledby': titleId, class: 'confirm' });
    const finish = (answer) => {
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    append(dialog, [
      h('h2', { id: titleId }, title),
      h('p', {}, body),
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: cancellable ? 'danger' : 'primary', 'data-confirm': '', onclick: () => finish(true) }, confirmLabel),
        cancellable ? h('button', { type: 'button', onclick: () => finish(false) }, 'Cancel') : null),
    ]);
    dialog.addEventListener('cancel', (event) => {
      event.preventDefault();
      finish(false);
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}
