// starlease console: one module, no framework, nothing loaded from
// elsewhere. Every call goes to this server's own HTTP API, with the API key
// as Authorization: Bearer. The key lives in the variable `apiKey` of this
// module only: never in the address, a cookie, web storage or the DOM.
// Untrusted strings are rendered with textContent only.

const API = new URL('../api/v1/target-leases', document.baseURI).pathname;
const READYZ = new URL('../readyz', document.baseURI).pathname;

// The API key, held in memory only. null when signed out.
let apiKey = null;

// Milliseconds to add to the browser's clock to get the server's: set from
// a response's Date header when the two differ by more than 2 s.
let clockSkew = 0;

// session counts sign-ins and sign-outs: an answer to a request made in an
// earlier session is dropped, so nothing a key read is shown after it was
// signed out, or to another key.
let session = 0;

const state = {
  // The list filter in force, its page tokens (tokens[i] opens page i) and
  // the index of the page shown.
  filter: null,
  tokens: [''],
  page: 0,
  // The lease shown in the detail panel, and the next history page token.
  detail: null,
  historyToken: '',
  // The administrative action in progress: its kind, lease, and the
  // request id of its confirmation (kept for a retry of the same request).
  admin: null,
  // The element to give focus back to when the dialog closes.
  returnFocus: null,
};

const $ = (id) => document.getElementById(id);

// ---- rendering helpers (textContent only) ---------------------------------

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

// An error as the console shows it: the API's envelope (code, message,
// field, correlation id, retry hint) with the HTTP status, or what is known
// when the answer was not an envelope.
function renderError(container, what, err) {
  clear(container);
  const box = el('div', null, 'envelope');
  box.appendChild(el('p', what + ' failed', 'envelope-title'));
  const dl = el('dl');
  const row = (k, v, cls) => {
    dl.appendChild(el('dt', k));
    const dd = el('dd');
    const code = el('code', v, cls);
    dd.appendChild(code);
    dl.appendChild(dd);
  };
  if (err.status) row('HTTP status', err.status, 'envelope-status');
  if (err.envelope) {
    const e = err.envelope;
    row('Code', e.code || '(none)', 'envelope-code');
    row('Message', e.msg || '', 'envelope-msg');
    if (e.field) row('Field', e.field, 'envelope-field');
    row('Correlation id', e.correlation_id || '(none)', 'envelope-correlation');
    if (e.retryable) {
      row('Retryable', e.retry_after_ms ? 'yes, after ' + e.retry_after_ms + ' ms' : 'yes', 'envelope-retry');
    }
  } else {
    row('Code', '(no envelope)', 'envelope-code');
    row('Detail', err.detail || 'the server did not answer with the API envelope', 'envelope-msg');
    row('Correlation id', err.correlation || '(none)', 'envelope-correlation');
  }
  box.appendChild(dl);
  container.appendChild(box);
}

function showError(what, err) {
  renderError($('messages'), what, err);
}

function clearMessages() {
  clear($('messages'));
  clear($('notice'));
}

function notice(text, code, correlation) {
  const n = $('notice');
  clear(n);
  const p = el('p', text + ' ');
  if (code) {
    p.appendChild(el('span', 'Code '));
    p.appendChild(el('code', code, 'notice-code'));
    p.appendChild(el('span', ' · correlation id '));
    p.appendChild(el('code', correlation, 'notice-correlation'));
  }
  n.appendChild(p);
}

// ---- time -----------------------------------------------------------------

function noteServerTime(resp) {
  const d = Date.parse(resp.headers.get('Date') || '');
  if (Number.isNaN(d)) return;
  // Date has one-second resolution: ignore differences it cannot tell.
  const skew = d + 500 - Date.now();
  clockSkew = Math.abs(skew) > 2000 ? skew : 0;
}

function serverNow() {
  return Date.now() + clockSkew;
}

function remaining(expiresMs) {
  const ms = expiresMs - serverNow();
  if (!Number.isFinite(ms)) return '';
  if (ms <= 0) return 'expired';
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + ' s';
  const m = Math.floor(s / 60);
  const rest = Math.floor(s % 60);
  if (m < 60) return m + ' min ' + String(rest).padStart(2, '0') + ' s';
  return Math.floor(m / 60) + ' h ' + String(m % 60).padStart(2, '0') + ' min';
}

function tick() {
  for (const cell of document.querySelectorAll('[data-expires]')) {
    const text = remaining(Number(cell.dataset.expires));
    if (cell.textContent !== text) cell.textContent = text;
    cell.classList.toggle('expired', text === 'expired');
  }
}

// ---- HTTP -----------------------------------------------------------------

// inFlight counts the requests under way; <main> is aria-busy meanwhile.
let inFlight = 0;

function busy(delta) {
  inFlight += delta;
  document.querySelector('main').setAttribute('aria-busy', inFlight > 0 ? 'true' : 'false');
}

// call makes one request to this origin's API. It resolves to the success
// envelope, or throws {status, envelope} / {status, detail, correlation}.
async function call(method, path, opts = {}) {
  const headers = new Headers();
  if (opts.auth !== false) {
    if (apiKey === null) throw { detail: 'not signed in' };
    try {
      headers.set('Authorization', 'Bearer ' + apiKey);
    } catch (e) {
      throw { detail: 'the key holds characters an HTTP header cannot carry' };
    }
  }
  let body;
  if (opts.body !== undefined) {
    headers.set('Content-Type', 'application/json');
    body = JSON.stringify(opts.body);
  }
  let resp;
  let json = null;
  const mine = session;
  busy(1);
  try {
    try {
      resp = await fetch(path, {
        method, headers, body,
        mode: 'same-origin', credentials: 'omit', cache: 'no-store',
        redirect: 'error', referrerPolicy: 'no-referrer',
      });
    } catch (e) {
      throw { detail: 'the request did not complete (network error or server unreachable)' };
    }
    if ((resp.headers.get('Content-Type') || '').startsWith('application/json')) {
      try { json = await resp.json(); } catch (e) { json = null; }
    }
  } finally {
    busy(-1);
  }
  if (opts.auth !== false && mine !== session) throw { stale: true };
  noteServerTime(resp);
  const correlation = resp.headers.get('X-Correlation-ID') || '';
  if (opts.anyStatus) return { status: resp.status, json };
  if (resp.ok && json && json.status === 'success') return json;
  if (json && json.status === 'error') throw { status: resp.status, envelope: json };
  throw { status: resp.status, detail: 'unexpected answer (' + (resp.headers.get('Content-Type') || 'no content type') + ')', correlation };
}

// apiError handles an error of an authenticated call: a 401 signs out (the
// key is no longer good, or never was) and shows only the envelope.
function apiError(what, err) {
  if (err && err.stale) return;
  if (err && err.status === 401) {
    signOut();
  }
  showError(what, err || { detail: 'unknown error' });
}

// ---- readiness (no key needed) --------------------------------------------

async function refreshReadiness() {
  const status = $('ready-status');
  const reason = $('ready-reason');
  const comps = $('ready-components');
  let r;
  try {
    r = await call('GET', READYZ, { auth: false, anyStatus: true });
  } catch (e) {
    status.textContent = 'unreachable';
    status.className = 'status bad';
    reason.textContent = e.detail || '';
    clear(comps);
    return;
  }
  const body = r.json || {};
  status.textContent = (body.status || 'unknown') + ' (HTTP ' + r.status + ')';
  status.className = 'status ' + (body.status === 'ok' ? 'ok' : body.status === 'degraded' ? 'warn' : 'bad');
  reason.textContent = body.reason ? '— ' + body.reason : '';
  clear(comps);
  const c = body.components || {};
  for (const name of Object.keys(c).sort()) {
    const li = el('li');
    li.appendChild(el('strong', name + ': '));
    li.appendChild(el('span', c[name].status || ''));
    if (c[name].reason) li.appendChild(el('span', ' — ' + c[name].reason));
    comps.appendChild(li);
  }
}

// ---- sign in / out ---------------------------------------------------------

async function signIn(ev) {
  ev.preventDefault();
  clearMessages();
  const input = $('key');
  const key = input.value.trim();
  // The field never keeps the key once it is read.
  input.value = '';
  if (key === '') {
    showError('Sign in', { detail: 'type an API key' });
    input.focus();
    return;
  }
  session++;
  apiKey = key;
  $('signin-button').disabled = true;
  try {
    // The server authenticates every request before it reads the query: a
    // list without a filter answers 401 for a key it does not accept and
    // 400 (the filter is missing) for one it does. Nothing is read.
    await call('GET', API);
    // A success would be unexpected, but the key was accepted.
  } catch (err) {
    if (err && err.stale) return;
    if (err && err.status === 400 && err.envelope && err.envelope.code === 'invalid_lease_request') {
      enterSession();
      return;
    }
    apiKey = null;
    showError('Sign in', err);
    input.focus();
    return;
  } finally {
    $('signin-button').disabled = false;
  }
  enterSession();
}

function enterSession() {
  $('signin').hidden = true;
  $('session').hidden = false;
  $('leases').hidden = false;
  notice('Signed in.');
  $('f-tenant').focus();
}

// signOut forgets the key and everything the key showed.
function signOut() {
  session++;
  apiKey = null;
  state.filter = null;
  state.tokens = [''];
  state.page = 0;
  state.detail = null;
  state.historyToken = '';
  closeAdmin();
  clear($('lease-rows'));
  $('lease-table').hidden = true;
  clear($('detail-fields'));
  clear($('history-rows'));
  $('history-table').hidden = true;
  $('list-status').textContent = '';
  $('history-status').textContent = '';
  $('page-info').textContent = '';
  for (const id of ['f-tenant', 'f-program', 'f-namespace', 'f-target', 'f-owner', 'open-id']) $(id).value = '';
  updatePager(false);
  $('detail').hidden = true;
  $('leases').hidden = true;
  $('session').hidden = true;
  $('signin').hidden = false;
  clearMessages();
}

// ---- list -----------------------------------------------------------------

function listBy() {
  const checked = document.querySelector('input[name="by"]:checked');
  return checked ? checked.value : 'program';
}

function showListFields() {
  const by = listBy();
  for (const p of document.querySelectorAll('#list-form [data-by]')) {
    const on = p.dataset.by.split(' ').includes(by);
    p.hidden = !on;
    for (const input of p.querySelectorAll('input')) input.disabled = !on;
  }
}

function readFilter() {
  const by = listBy();
  const v = (id) => $(id).value.trim();
  const f = { by, params: {} };
  if (by === 'owner') {
    f.params.owner_principal_id = v('f-owner');
  } else {
    f.params.tenant_id = v('f-tenant');
    f.params.program_id = v('f-program');
    if (by === 'target') {
      f.params.target_namespace = v('f-namespace');
      f.params.target_id = v('f-target');
    }
  }
  const size = Number($('f-page-size').value);
  f.pageSize = Number.isInteger(size) && size >= 1 && size <= 100 ? String(size) : '25';
  $('f-page-size').value = f.pageSize;
  return f;
}

async function submitList(ev) {
  ev.preventDefault();
  clearMessages();
  state.filter = readFilter();
  state.tokens = [''];
  state.page = 0;
  await loadPage();
}

async function loadPage() {
  if (!state.filter) return;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(state.filter.params)) q.set(k, v);
  q.set('page_size', state.filter.pageSize);
  const token = state.tokens[state.page];
  if (token) q.set('page_token', token);
  $('list-status').textContent = 'Loading…';
  let res;
  try {
    res = await call('GET', API + '?' + q.toString());
  } catch (err) {
    if (err && err.stale) return;
    $('list-status').textContent = '';
    clear($('lease-rows'));
    $('lease-table').hidden = true;
    updatePager(false);
    apiError('List leases', err);
    return;
  }
  const leases = res.leases || [];
  const next = res.next_page_token || '';
  state.tokens.length = state.page + 1;
  if (next) state.tokens.push(next);
  renderLeases(leases);
  const what = describeFilter(state.filter);
  $('list-status').textContent = leases.length === 0
    ? 'No active leases you may see ' + what + ' on this page.'
    : leases.length + (leases.length === 1 ? ' active lease ' : ' active leases ') + what + '.';
  $('page-info').textContent = 'Page ' + (state.page + 1) + (next ? '' : ' (last)');
  updatePager(true);
}

function describeFilter(f) {
  const p = f.params;
  if (f.by === 'owner') return 'of owner ' + p.owner_principal_id;
  if (f.by === 'target') return 'on target ' + [p.tenant_id, p.program_id, p.target_namespace, p.target_id].join(' / ');
  return 'in program ' + p.tenant_id + ' / ' + p.program_id;
}

function updatePager(on) {
  $('page-first').disabled = !on || state.page === 0;
  $('page-prev').disabled = !on || state.page === 0;
  $('page-next').disabled = !on || state.tokens.length <= state.page + 1;
}

function renderLeases(leases) {
  const rows = $('lease-rows');
  clear(rows);
  for (const l of leases) {
    const id = l.lock_identity || {};
    const tr = el('tr');
    tr.dataset.leaseId = l.lease_id;
    const first = el('td');
    const open = el('button', l.lease_id, 'link open-lease');
    open.type = 'button';
    open.setAttribute('aria-label', 'Open lease ' + l.lease_id);
    open.addEventListener('click', () => openLease(l.lease_id, open));
    first.appendChild(open);
    tr.appendChild(first);
    tr.appendChild(el('td', id.tenant_id));
    tr.appendChild(el('td', id.program_id));
    tr.appendChild(el('td', (id.target_namespace || '') + ' / ' + (id.target_id || '')));
    tr.appendChild(el('td', id.actor_name));
    tr.appendChild(el('td', id.workflow_name));
    tr.appendChild(el('td', id.operation_class));
    tr.appendChild(el('td', l.fencing_token));
    const ttl = el('td', null, 'ttl');
    ttl.dataset.expires = String(Date.parse(l.expires_at));
    tr.appendChild(ttl);
    tr.appendChild(el('td', l.expires_at));
    rows.appendChild(tr);
  }
  $('lease-table').hidden = leases.length === 0;
  tick();
}

// ---- detail and history ---------------------------------------------------

const LEASE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$/;

function leasePath(id, suffix = '') {
  return API + '/' + encodeURIComponent(id) + suffix;
}

async function submitOpen(ev) {
  ev.preventDefault();
  clearMessages();
  const id = $('open-id').value.trim();
  if (!LEASE_ID_RE.test(id) || id.includes('..')) {
    showError('Open lease', { detail: 'a lease id has letters, digits and . _ : - only (no ..), like lease_01…' });
    $('open-id').focus();
    return;
  }
  await openLease(id, $('open-button'));
}

async function openLease(id, from) {
  clearMessages();
  let res;
  try {
    res = await call('GET', leasePath(id));
  } catch (err) {
    if (err && err.stale) return;
    apiError('Inspect lease', err);
    return;
  }
  state.returnFocus = from || null;
  showDetail(res.lease);
  $('detail').hidden = false;
  $('detail-title').focus();
  await loadHistory(true);
}

function showDetail(l) {
  state.detail = l;
  const dl = $('detail-fields');
  clear(dl);
  const id = l.lock_identity || {};
  const add = (k, v, cls) => {
    dl.appendChild(el('dt', k));
    const dd = el('dd', v, cls);
    dl.appendChild(dd);
    return dd;
  };
  add('Lease id', l.lease_id, 'd-lease-id');
  add('State', l.state, 'd-state');
  add('Tenant', id.tenant_id);
  add('Program', id.program_id);
  add('Target namespace', id.target_namespace);
  add('Target id', id.target_id);
  add('Actor', id.actor_name);
  add('Workflow', id.workflow_name);
  add('Operation class', id.operation_class);
  add('Fencing token', l.fencing_token, 'd-fencing');
  add('Acquired at', l.acquired_at);
  add('Renewed at', l.renewed_at);
  add('Expires at', l.expires_at);
  add('TTL', l.ttl_ms + ' ms');
  const ttl = add('Remaining TTL', '', 'ttl d-remaining');
  if (l.state === 'active') {
    ttl.dataset.expires = String(Date.parse(l.expires_at));
  } else {
    ttl.textContent = 'ended (' + l.state + ')';
  }
  const active = l.state === 'active';
  $('detail-force').disabled = !active;
  $('detail-revoke').disabled = !active;
  tick();
}

async function refreshDetail() {
  if (!state.detail) return;
  clearMessages();
  try {
    const res = await call('GET', leasePath(state.detail.lease_id));
    showDetail(res.lease);
  } catch (err) {
    if (err && err.stale) return;
    apiError('Inspect lease', err);
    return;
  }
  await loadHistory(true);
}

async function loadHistory(fresh) {
  if (!state.detail) return;
  if (fresh) {
    state.historyToken = '';
    clear($('history-rows'));
    $('history-table').hidden = true;
  }
  const q = new URLSearchParams({ page_size: '25' });
  if (state.historyToken) q.set('page_token', state.historyToken);
  $('history-status').textContent = 'Loading…';
  let res;
  try {
    res = await call('GET', leasePath(state.detail.lease_id, '/history') + '?' + q.toString());
  } catch (err) {
    if (err && err.stale) return;
    $('history-status').textContent = '';
    $('history-more').hidden = true;
    apiError('Read history', err);
    return;
  }
  const entries = res.history || [];
  const rows = $('history-rows');
  for (const h of entries) {
    const tr = el('tr');
    tr.appendChild(el('td', h.lease_id));
    tr.appendChild(el('td', h.state, 'h-state'));
    tr.appendChild(el('td', h.fencing_token));
    tr.appendChild(el('td', h.acquired_at));
    tr.appendChild(el('td', h.ended_at));
    tr.appendChild(el('td', h.reason || '', 'h-reason'));
    tr.appendChild(el('td', h.incident_id || '', 'h-incident'));
    rows.appendChild(tr);
  }
  state.historyToken = res.next_page_token || '';
  $('history-more').hidden = !state.historyToken;
  $('history-table').hidden = rows.childElementCount === 0;
  $('history-status').textContent = rows.childElementCount === 0
    ? 'No ended lease of this identity yet.'
    : rows.childElementCount + ' ended ' + (rows.childElementCount === 1 ? 'lease' : 'leases') + ' shown.';
}

function closeDetail() {
  state.detail = null;
  clear($('detail-fields'));
  clear($('history-rows'));
  $('detail').hidden = true;
  const back = state.returnFocus;
  state.returnFocus = null;
  if (back && document.body.contains(back)) back.focus();
  else $('open-id').focus();
}

// ---- force-release and revoke ----------------------------------------------

const ACTIONS = {
  force: { title: 'Force-release lease', verb: 'force-release', path: '/force-release', done: 'Force-released' },
  revoke: { title: 'Revoke lease', verb: 'revoke', path: '/revoke', done: 'Revoked' },
};

function randomID() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return 'console-' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

function openAdmin(kind, from) {
  if (!state.detail) return;
  const a = ACTIONS[kind];
  const l = state.detail;
  state.admin = { kind, lease: l, requestID: null, returnFocus: from };
  $('admin-title').textContent = a.title;
  $('admin-summary').textContent = 'Lease ' + l.lease_id + ' (fencing token ' + l.fencing_token + ') on ' +
    identityText(l.lock_identity) + '.';
  $('admin-reason').value = '';
  $('admin-incident').value = '';
  $('admin-confirm').textContent = 'Confirm ' + a.verb;
  adminStep('input');
  clear($('admin-messages'));
  $('admin-dialog').showModal();
  $('admin-reason').focus();
}

function identityText(id) {
  id = id || {};
  return [id.tenant_id, id.program_id, id.target_namespace, id.target_id, id.actor_name, id.workflow_name,
    id.operation_class].join(' / ');
}

function adminStep(step) {
  const confirm = step === 'confirm';
  $('admin-step-input').hidden = confirm;
  $('admin-step-confirm').hidden = !confirm;
  $('admin-next').hidden = confirm;
  $('admin-confirm').hidden = !confirm;
  $('admin-back').hidden = !confirm;
}

function adminReview(ev) {
  ev.preventDefault();
  if (!state.admin) return;
  clear($('admin-messages'));
  const reason = $('admin-reason').value.trim();
  const incident = $('admin-incident').value.trim();
  if (reason === '' && incident === '') {
    renderError($('admin-messages'), 'Review', { detail: 'give a reason or an incident id' });
    $('admin-reason').focus();
    return;
  }
  const a = ACTIONS[state.admin.kind];
  state.admin.reason = reason;
  state.admin.incident = incident;
  // One request id per confirmed body: pressing Confirm again after an
  // error retries the same request (the server replays a committed one).
  state.admin.requestID = randomID();
  const t = $('admin-confirm-text');
  clear(t);
  t.appendChild(el('span', 'You are about to ' + a.verb + ' lease ' + state.admin.lease.lease_id +
    ' (fencing token ' + state.admin.lease.fencing_token + '). Its holder loses it at once and its fenced writes are refused. '));
  if (reason) t.appendChild(el('span', 'Reason: “' + reason + '”. '));
  if (incident) t.appendChild(el('span', 'Incident id: ' + incident + '. '));
  adminStep('confirm');
  $('admin-confirm').focus();
}

async function adminConfirm() {
  const ad = state.admin;
  if (!ad || !ad.requestID) return;
  const a = ACTIONS[ad.kind];
  const body = {
    lock_identity: ad.lease.lock_identity,
    fencing_token: ad.lease.fencing_token,
    request_id: ad.requestID,
  };
  if (ad.reason) body.reason = ad.reason;
  if (ad.incident) body.incident_id = ad.incident;
  $('admin-confirm').disabled = true;
  let res;
  try {
    res = await call('POST', leasePath(ad.lease.lease_id, a.path), { body });
  } catch (err) {
    if (err && err.stale) return;
    $('admin-confirm').disabled = false;
    if (err && err.status === 401) {
      apiError(a.title, err);
      return;
    }
    renderError($('admin-messages'), a.title, err);
    return;
  }
  $('admin-confirm').disabled = false;
  closeAdmin();
  notice(a.done + ' lease ' + ad.lease.lease_id + '.', res.code, res.correlation_id);
  if (res.lease) showDetail(res.lease);
  await loadHistory(true);
  if (state.filter) await loadPage();
  $('detail-title').focus();
}

function closeAdmin() {
  const d = $('admin-dialog');
  const back = state.admin && state.admin.returnFocus;
  state.admin = null;
  $('admin-reason').value = '';
  $('admin-incident').value = '';
  clear($('admin-messages'));
  if (d.open) d.close();
  if (back && document.body.contains(back) && !back.disabled) back.focus();
}

// ---- wiring ---------------------------------------------------------------

function init() {
  const loopback = ['localhost', '127.0.0.1', '[::1]'].includes(location.hostname);
  $('transport-warning').hidden = location.protocol === 'https:' || loopback;

  $('signin-form').addEventListener('submit', signIn);
  $('signout').addEventListener('click', () => { signOut(); notice('Signed out; the key is forgotten.'); $('key').focus(); });
  $('ready-refresh').addEventListener('click', refreshReadiness);
  for (const r of document.querySelectorAll('input[name="by"]')) r.addEventListener('change', showListFields);
  $('list-form').addEventListener('submit', submitList);
  $('page-first').addEventListener('click', () => { state.page = 0; loadPage(); });
  $('page-prev').addEventListener('click', () => { if (state.page > 0) { state.page--; loadPage(); } });
  $('page-next').addEventListener('click', () => { if (state.tokens.length > state.page + 1) { state.page++; loadPage(); } });
  $('open-form').addEventListener('submit', submitOpen);
  $('detail-refresh').addEventListener('click', refreshDetail);
  $('detail-close').addEventListener('click', closeDetail);
  $('detail-force').addEventListener('click', (e) => openAdmin('force', e.currentTarget));
  $('detail-revoke').addEventListener('click', (e) => openAdmin('revoke', e.currentTarget));
  $('history-more').addEventListener('click', () => loadHistory(false));
  $('admin-form').addEventListener('submit', adminReview);
  $('admin-confirm').addEventListener('click', adminConfirm);
  $('admin-back').addEventListener('click', () => { adminStep('input'); clear($('admin-messages')); $('admin-reason').focus(); });
  $('admin-cancel').addEventListener('click', closeAdmin);
  $('admin-dialog').addEventListener('cancel', (e) => { e.preventDefault(); closeAdmin(); });
  // However else the dialog closes, the action in progress is dropped.
  // A close event is dispatched after the close itself: one still on its
  // way when the dialog was opened again must not close the new one.
  $('admin-dialog').addEventListener('close', () => { if (state.admin && !$('admin-dialog').open) closeAdmin(); });
  // Leaving the page forgets the key, also when the browser would keep the
  // page in its back/forward cache.
  window.addEventListener('pagehide', () => signOut());

  showListFields();
  refreshReadiness();
  setInterval(refreshReadiness, 15000);
  setInterval(tick, 250);
  $('key').focus();
}

init();
