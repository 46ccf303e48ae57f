// lib/rain.js — what every rain k6 script shares: configuration from the
// environment, the operator calls, POST /grab with its checks against the HTTP
// contract (docs/api.md), the per-status metrics, and a small text summary
// that needs nothing from the network (no jslib import), so scripts run offline.
//
// Import it with a relative path: import * as rain from './lib/rain.js';
//
// Everything here that creates a metric or a response callback runs in the init
// context, as k6 requires; the functions are for setup(), the VU code and
// handleSummary().

import http from 'k6/http';
import crypto from 'k6/crypto';
import encoding from 'k6/encoding';
import { check, sleep } from 'k6';
import { Counter, Rate, Trend } from 'k6/metrics';

// ---------------------------------------------------------------- environment

// env returns __ENV[name], or def when it is unset or empty.
export function env(name, def) {
  const v = __ENV[name];
  return v === undefined || v === '' ? def : v;
}

// envInt returns a whole number of at least min, or def when unset.
export function envInt(name, def, min = 0) {
  const v = env(name, undefined);
  if (v === undefined) return def;
  if (!/^\d+$/.test(v)) throw new Error(`${name}=${v}: want a whole number`);
  const n = parseInt(v, 10);
  if (n < min) throw new Error(`${name}=${v}: want at least ${min}`);
  return n;
}

// envFloat returns a number in [min, max], or def when unset.
export function envFloat(name, def, min, max) {
  const v = env(name, undefined);
  if (v === undefined) return def;
  const n = Number(v);
  if (!/^\d*\.?\d+$/.test(v) || n < min || n > max) {
    throw new Error(`${name}=${v}: want a number from ${min} to ${max}`);
  }
  return n;
}

// envDuration returns a k6 duration string ("30s", "1m30s", "500ms"), or def.
export function envDuration(name, def) {
  const v = env(name, def);
  seconds(v, name);
  return v;
}

// seconds parses a duration the way k6 writes them (Go's units h, m, s, ms,
// combined as in "1m30s") into seconds.
export function seconds(d, what = 'duration') {
  if (typeof d !== 'string' || !/^(\d+(\.\d+)?(ms|h|m|s))+$/.test(d)) {
    throw new Error(`${what}=${d}: want a duration such as 30s, 1m30s or 500ms`);
  }
  const unit = { h: 3600, m: 60, s: 1, ms: 0.001 };
  const re = /(\d+(?:\.\d+)?)(ms|h|m|s)/g;
  let total = 0;
  let m;
  while ((m = re.exec(d)) !== null) total += Number(m[1]) * unit[m[2]];
  return total;
}

// ID_RE is the contract's id syntax: 1–64 of A-Z a-z 0-9 _ - . :
export const ID_RE = /^[A-Za-z0-9_.:-]{1,64}$/;

function checkID(what, id) {
  if (!ID_RE.test(id)) throw new Error(`${what}=${id}: ids are 1-64 characters from A-Z a-z 0-9 _ - . :`);
  return id;
}

// BASE_URLS are the rain instances to load, comma-separated in BASE_URL
// (for the compose stack: http://127.0.0.1:8081,http://127.0.0.1:8082).
// Grabs go round-robin over them; operator calls go to the first.
export const BASE_URLS = env('BASE_URL', 'http://127.0.0.1:8080')
  .split(',')
  .map((u) => u.trim().replace(/\/+$/, ''))
  .filter((u) => u !== '');
export const BASE_URL = BASE_URLS[0];
if (BASE_URL === undefined) throw new Error('BASE_URL is empty');

export const ADMIN_TOKEN = env('ADMIN_TOKEN', '');
// PREFIX starts every user id; ids are PREFIX + a number.
export const PREFIX = checkID('PREFIX', env('PREFIX', 'u'));
// TIMEOUT bounds one grab; a grab that takes longer counts as failed.
export const TIMEOUT = envDuration('TIMEOUT', '2s');
// ADMIN_TIMEOUT bounds one operator call (a preload of millions of packets).
export const ADMIN_TIMEOUT = envDuration('ADMIN_TIMEOUT', '120s');
// SUMMARY is where handleSummary writes the JSON summary; "-" writes none.
export const SUMMARY = env('SUMMARY', 'summary.json');

// USER_SECRET_FILE names the HS256 secret of rain serve --user-auth
// hs256:FILE: with it, every grab carries a user token signed with it
// (Authorization: Bearer, sub = the user id), as the app's login service
// would sign one, so that the load runs the production path. Read in the
// init context, as k6's open() requires; surrounding white space is not part
// of the secret (as rain reads it). USER_AUDIENCE and USER_ISSUER are the
// token's aud and iss (rain serve --user-auth-audience, --user-auth-issuer);
// TOKEN_TTL how long each token is valid, in seconds.
const USER_SECRET_FILE = env('USER_SECRET_FILE', '');
const USER_SECRET = USER_SECRET_FILE === '' ? '' : open(USER_SECRET_FILE).trim();
if (USER_SECRET_FILE !== '' && USER_SECRET.length < 32) {
  throw new Error(`USER_SECRET_FILE ${USER_SECRET_FILE}: a secret of ${USER_SECRET.length} bytes; rain wants at least 32`);
}
export const SIGNED = USER_SECRET !== '';
const USER_AUDIENCE = env('USER_AUDIENCE', '');
const USER_ISSUER = env('USER_ISSUER', '');
const TOKEN_TTL = envInt('TOKEN_TTL', 3600, 60);
const JWT_HEADER = encoding.b64encode('{"alg":"HS256","typ":"JWT"}', 'rawurl');

// userToken is an HS256 JWT for user: sub, iat, exp (TOKEN_TTL ahead), and
// aud and iss when given.
export function userToken(user) {
  const now = Math.floor(Date.now() / 1000);
  const claims = { sub: user, iat: now, exp: now + TOKEN_TTL };
  if (USER_AUDIENCE !== '') claims.aud = USER_AUDIENCE;
  if (USER_ISSUER !== '') claims.iss = USER_ISSUER;
  const signed = `${JWT_HEADER}.${encoding.b64encode(JSON.stringify(claims), 'rawurl')}`;
  return `${signed}.${crypto.hmac('sha256', USER_SECRET, signed, 'base64rawurl')}`;
}

// poolFromEnv returns POOL (checked), or '' when a fresh pool id is wanted.
export function poolFromEnv() {
  const p = env('POOL', '');
  return p === '' ? '' : checkID('POOL', p);
}

// newPoolID returns a pool id nobody has used: call it in setup(), never in
// the init context, which runs once per VU and would give each VU its own.
export function newPoolID(prefix) {
  const r = Math.floor(Math.random() * Math.pow(36, 6)).toString(36);
  return checkID('pool id', `${prefix}-${Date.now().toString(36)}-${r}`);
}

// ------------------------------------------------------------------- metrics

// GRAB_STATUSES is the table of docs/api.md: every status POST /grab
// answers, its HTTP code, and what the answer must carry.
export const GRAB_STATUSES = Object.freeze({
  granted: { code: 200, grant: true },
  already_granted: { code: 200, grant: true },
  sold_out: { code: 410 },
  ended: { code: 410 },
  not_found: { code: 404 },
  not_started: { code: 425, retryAfter: true },
  overloaded: { code: 503, retryAfter: true, beforeBody: true }, // a shed may come before the body
  invalid: { code: 400, error: true },
  // beforeBody: may be answered before the body is read, naming no pool or
  // user (a shed; no token or a bad one; over the per-IP rate).
  unauthorized: { code: 401, error: true, beforeBody: true },
  rate_limited: { code: 429, retryAfter: true, beforeBody: true },
});

// GRAB_CODES are the HTTP codes of answers a client expects under load: 503
// (shed), 429 (over a rate limit) and 410 (sold out) are answers, not
// failures. 400 and 401 are not among them: these scripts never send a
// malformed grab, and run against rain with user auth off.
export const GRAB_CODES = [200, 404, 410, 425, 429, 503];

// Metric names, for thresholds.
export const M = Object.freeze({
  shed: 'rain_grab_shed', // Rate: share of grabs answered overloaded
  doubleGrants: 'rain_grab_double_grants', // Counter: repeats answered with another grant
  grantedCents: 'rain_granted_cents', // Counter: cents of new grants
  other: 'rain_grab_other', // Counter: answers with no status of docs/api.md
  status: (s) => `rain_grab_${s}`, // Counter per status
  preloadRate: 'rain_preload_packets_per_s', // Trend: packets loaded per second
});

const statusCounters = {};
for (const s of Object.keys(GRAB_STATUSES)) statusCounters[s] = new Counter(M.status(s));
const otherCounter = new Counter(M.other);
const shedRate = new Rate(M.shed);
const doubleGrants = new Counter(M.doubleGrants);
const grantedCents = new Counter(M.grantedCents);
export const preloadRate = new Trend(M.preloadRate);

// Response callbacks, made once (k6 advises against one per request).
// Operator calls carry their own, so they are judged by the operator contract
// and not by the grab callback a script sets with http.setResponseCallback.
export const ADMIN_OK = http.expectedStatuses({ min: 200, max: 299 });
export const EXPECT_401 = http.expectedStatuses(401);
export const EXPECT_409 = http.expectedStatuses(409);

const JSON_HEADERS = { 'Content-Type': 'application/json' };

// adminParams are the params of an operator call named name (the URL tag, so
// that pool ids do not make one time series each), tagged endpoint (for
// thresholds: "preload" for POST /admin/pools, else "admin").
export function adminParams(name, extra = {}, endpoint = 'admin') {
  return Object.assign(
    {
      headers: Object.assign({ Authorization: `Bearer ${ADMIN_TOKEN}` }, JSON_HEADERS),
      tags: { name, endpoint },
      timeout: ADMIN_TIMEOUT,
      responseCallback: ADMIN_OK,
    },
    extra,
  );
}

const GRAB_PARAMS = { headers: JSON_HEADERS, tags: { name: 'POST /grab', endpoint: 'grab' }, timeout: TIMEOUT };

// parseJSON returns the body as JSON, or null: an exception inside a check
// would abort the iteration and hide the very answer we want to count.
export function parseJSON(res) {
  try {
    return res.json();
  } catch (e) {
    return null;
  }
}

// ------------------------------------------------------------ operator calls

// waitReady throws unless every rain instance answers GET /readyz with 200.
export function waitReady() {
  for (const base of BASE_URLS) {
    const res = http.get(`${base}/readyz`, { tags: { name: 'GET /readyz' }, responseCallback: ADMIN_OK });
    if (res.status !== 200) {
      throw new Error(`rain is not ready at ${base} (GET /readyz: ${res.status} ${res.error || res.body}); start it first`);
    }
  }
}

// poolSpec builds the body of POST /admin/pools; optional fields only when set.
export function poolSpec({ poolID, packets, totalCents, subPools = 0, startIn = 0, holdSeconds = 0 }) {
  const spec = { pool_id: checkID('pool id', poolID), total_cents: totalCents, count: packets };
  if (subPools > 0) spec.sub_pools = subPools;
  if (holdSeconds > 0) spec.hold_seconds = holdSeconds;
  if (startIn > 0) spec.starts_at = new Date(Date.now() + startIn * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
  return spec;
}

// postPool sends POST /admin/pools; after a 503 (a shard unavailable) it
// waits the Retry-After and tries again, 5 times at most.
export function postPool(spec, extra = {}) {
  const body = JSON.stringify(spec);
  let res;
  for (let attempt = 0; attempt < 5; attempt++) {
    res = http.post(`${BASE_URL}/admin/pools`, body, adminParams('POST /admin/pools', extra, 'preload'));
    if (res.status !== 503) break;
    sleep(Number(res.headers['Retry-After']) || 1);
  }
  return res;
}

// preload loads spec and throws unless rain answers 201 (created) or 200 (the
// same spec was already loaded under that id), as setup() needs.
export function preload(spec) {
  if (ADMIN_TOKEN === '') {
    throw new Error('ADMIN_TOKEN is empty: give rain\'s admin token (k6 run -e ADMIN_TOKEN=...)');
  }
  const start = Date.now();
  const res = postPool(spec);
  const ok = check(res, { 'preload: 201 created or 200 same spec': (r) => r.status === 201 || r.status === 200 });
  if (!ok) {
    const hint = res.status === 409 ? ' (POOL exists with another spec: use the same PACKETS/TOTAL_CENTS/... or another POOL)' : '';
    throw new Error(`preload ${spec.pool_id}: HTTP ${res.status}${hint}: ${res.error || res.body}`);
  }
  if (res.status === 201) preloadRate.add(spec.count / Math.max(0.001, (Date.now() - start) / 1000));
  return res;
}

// loadPool is the setup() of the grab scripts: rain ready, then the pool
// POOL, or a new one named after prefix, preloaded. It returns the pool id
// and preload's answer.
export function loadPool(pool, prefix, { packets, totalCents, subPools = 0, holdSeconds = 0, startIn = 0 }) {
  waitReady();
  const poolID = pool || newPoolID(prefix);
  const res = preload(poolSpec({ poolID, packets, totalCents, subPools, holdSeconds, startIn }));
  return { poolID, res };
}

// grabThresholds are the thresholds of the grab scripts:
//   - grab latency only (setup's preload and teardown's audit are operator
//     calls that may take seconds, and are not what a phone waits for);
//   - failures: 503 and 410 are answers (see GRAB_CODES); what fails is a
//     timeout, a refused connection, a 500 or a 400, and a rain that is down
//     stops the run after abortAfter instead of hammering on;
//   - dropped iterations (k6 could not start them on time: the rain was not
//     played as planned, so the other figures understate the load);
//   - checks, the share of overloaded answers, and never a second grant (a
//     repeat answered with another grant is money out of thin air).
export function grabThresholds({ p99Ms, maxFailed, abortAfter, maxDropped, checksRate, maxShed }) {
  return {
    'http_req_duration{endpoint:grab}': [`p(99)<${p99Ms}`],
    http_req_failed: [{ threshold: `rate<${maxFailed}`, abortOnFail: true, delayAbortEval: abortAfter }],
    dropped_iterations: [`count<=${maxDropped}`],
    checks: [`rate>${checksRate}`],
    [M.shed]: [`rate<${maxShed}`],
    [M.doubleGrants]: ['count<1'],
  };
}

export function getPool(poolID) {
  return http.get(`${BASE_URL}/admin/pools/${poolID}`, adminParams('GET /admin/pools/{pool_id}'));
}

export function getAudit(poolID) {
  return http.get(`${BASE_URL}/admin/pools/${poolID}/audit`, adminParams('GET /admin/pools/{pool_id}/audit'));
}

// checkAudit checks GET /admin/pools/{id}/audit answers ok:true with no problems.
export function checkAudit(res) {
  const body = parseJSON(res);
  return check(res, {
    'audit: 200': (r) => r.status === 200,
    'audit: ok, no problems': () => body !== null && body.ok === true && Array.isArray(body.problems) && body.problems.length === 0,
  });
}

// ---------------------------------------------------------------- the grab

// Recent is one VU's memory of the users it sent lately and the grant each got,
// so that a repeat grab (a retry, a double tap) can be checked against the
// first answer. It is per VU: k6 VUs share no memory.
export class Recent {
  constructor(size) {
    this.size = size;
    this.users = []; // ring of {user, grant}; grant is null until one is seen
    this.next = 0;
  }

  pick() {
    return this.users[Math.floor(Math.random() * this.users.length)];
  }

  add(entry) {
    if (this.users.length < this.size) this.users.push(entry);
    else this.users[this.next] = entry;
    this.next = (this.next + 1) % this.size;
  }
}

function isCount(v) {
  return Number.isInteger(v) && v > 0;
}

const RFC3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/;

function hasGrant(body) {
  return isCount(body.amount_cents) && isCount(body.serial) && typeof body.expires_at === 'string' &&
    RFC3339.test(body.expires_at) && !isNaN(Date.parse(body.expires_at));
}

// checkGrab checks one answer of POST /grab against docs/api.md, counts its
// status, and returns {status, grant}. prior is the grant this VU saw for the
// user before (null if none): while it is held, a repeat must come back
// already_granted with the same amount and serial, never as a second grant.
export function checkGrab(res, req, prior) {
  const body = parseJSON(res);
  const status = body !== null && typeof body.status === 'string' ? body.status : '';
  const spec = Object.prototype.hasOwnProperty.call(GRAB_STATUSES, status) ? GRAB_STATUSES[status] : undefined;
  (spec ? statusCounters[status] : otherCounter).add(1);
  shedRate.add(status === 'overloaded');

  const sets = { 'grab: a status of docs/api.md': () => spec !== undefined };
  let grant = null;
  if (spec) {
    sets[`${status}: HTTP ${spec.code}`] = (r) => r.status === spec.code;
    sets[`${status}: echoes pool_id and user_id`] = () => (body.pool_id === req.pool_id && body.user_id === req.user_id) ||
      (spec.beforeBody === true && body.pool_id === '' && body.user_id === '');
    if (spec.grant) {
      sets[`${status}: amount_cents, serial, expires_at`] = () => hasGrant(body);
      if (hasGrant(body)) {
        grant = { amount_cents: body.amount_cents, serial: body.serial, expires_ms: Date.parse(body.expires_at) };
        if (status === 'granted') grantedCents.add(body.amount_cents);
      }
    } else {
      sets[`${status}: no grant fields`] = () =>
        body.amount_cents === undefined && body.serial === undefined && body.expires_at === undefined;
    }
    if (spec.retryAfter) sets[`${status}: Retry-After`] = (r) => /^\d+$/.test(r.headers['Retry-After'] || '');
    if (spec.error) sets[`${status}: error says what`] = () => typeof body.error === 'string' && body.error !== '';
  }
  // Compare only while the first grant is surely still held (5 s of margin
  // for the clocks of this machine and the shard): a released grant does not
  // count, and its user may be granted anew.
  if (prior && grant && Date.now() + 5000 < prior.expires_ms) {
    const same = status === 'already_granted' && grant.amount_cents === prior.amount_cents && grant.serial === prior.serial;
    sets['repeat: already_granted, same amount_cents and serial'] = () => same;
    if (!same) doubleGrants.add(1);
  }
  check(res, sets);
  return { status, grant };
}

// grabOnce is one phone's tap: with probability repeat it re-sends a user this
// VU sent before (a retry or a double tap), otherwise a new user
// PREFIX + (iteration mod users). It posts to the instance iteration picks,
// checks the answer, and remembers the user and any grant in recent.
export function grabOnce({ poolID, iteration, users, repeat, recent }) {
  let entry = null;
  if (recent.users.length > 0 && Math.random() < repeat) entry = recent.pick();
  const fresh = entry === null;
  if (fresh) entry = { user: `${PREFIX}${iteration % users}`, grant: null, params: GRAB_PARAMS };
  if (fresh && SIGNED) {
    // One token per user, signed once: a repeat carries the same one.
    const headers = Object.assign({ Authorization: `Bearer ${userToken(entry.user)}` }, JSON_HEADERS);
    entry.params = Object.assign({}, GRAB_PARAMS, { headers });
  }

  const base = BASE_URLS[iteration % BASE_URLS.length];
  const req = { pool_id: poolID, user_id: entry.user };
  // ids match the contract's charset (checked at start), so no escaping is needed.
  const res = http.post(`${base}/grab`, `{"pool_id":"${req.pool_id}","user_id":"${req.user_id}"}`, entry.params);
  const { status, grant } = checkGrab(res, req, entry.grant);
  if (grant !== null && entry.grant === null) entry.grant = grant;
  if (fresh) recent.add(entry);
  return status;
}

// ------------------------------------------------------------------- options

// arrivals is how many iterations a ramping-arrival-rate scenario plans:
// each stage ramps linearly from the previous target.
export function arrivals(startRate, stages) {
  let total = 0;
  let from = startRate;
  for (const st of stages) {
    total += ((from + st.target) / 2) * seconds(st.duration);
    from = st.target;
  }
  return Math.round(total);
}

// SUMMARY_TREND_STATS are the trend statistics the summaries keep.
export const SUMMARY_TREND_STATS = ['avg', 'min', 'med', 'max', 'p(90)', 'p(99)', 'p(99.9)', 'count'];

// ------------------------------------------------------------------- summary

function group3(n) {
  const s = String(Math.round(n));
  return s.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

function ms(v) {
  if (typeof v !== 'number' || isNaN(v)) return '-';
  return v >= 1000 ? `${(v / 1000).toFixed(2)}s` : `${v.toFixed(v < 10 ? 2 : 1)}ms`;
}

function pct(v) {
  return typeof v === 'number' && !isNaN(v) ? `${(v * 100).toFixed(2)}%` : '-';
}

function values(data, name) {
  const m = data.metrics && data.metrics[name];
  return m && m.values ? m.values : null;
}

// textSummary is a short, plain text end-of-test report: what ran, the grab
// statuses, grab latency, and each threshold with its verdict.
export function textSummary(data, title) {
  const out = [''];
  const dur = data.state && data.state.testRunDurationMs ? data.state.testRunDurationMs / 1000 : 0;
  out.push(`rain k6 summary: ${title}`);
  const pool = data.setup_data && (data.setup_data.pool_id || data.setup_data.prefix);
  if (pool) out.push(`  pool          ${pool}`);
  const it = values(data, 'iterations');
  const dropped = values(data, 'dropped_iterations');
  out.push(`  duration      ${dur.toFixed(1)}s` +
    (it ? `   iterations ${group3(it.count)} (${group3(it.rate)}/s)` : '') +
    `   dropped ${group3(dropped ? dropped.count : 0)}`);

  const counts = [];
  for (const s of Object.keys(GRAB_STATUSES).concat(['other'])) {
    const v = values(data, s === 'other' ? M.other : M.status(s));
    if (v && v.count > 0) counts.push(`${s} ${group3(v.count)}`);
  }
  if (counts.length > 0) out.push(`  grab answers  ${counts.join('  ')}`);
  const shed = values(data, M.shed);
  if (shed && !isNaN(shed.rate)) out.push(`  shed          ${pct(shed.rate)} answered overloaded`);
  const loads = values(data, M.preloadRate);
  if (loads && loads.count > 0) out.push(`  preload       ${group3(loads.med)} packets/s (median of ${loads.count})`);

  const grab = values(data, 'http_req_duration{endpoint:grab}');
  const lat = grab || values(data, 'http_req_duration');
  if (lat) {
    out.push(`  ${grab ? 'grab latency' : 'latency     '}  p50 ${ms(lat.med)}  p90 ${ms(lat['p(90)'])}  p99 ${ms(lat['p(99)'])}` +
      `  p99.9 ${ms(lat['p(99.9)'])}  max ${ms(lat.max)}`);
  }
  const failed = values(data, 'http_req_failed');
  const checks = values(data, 'checks');
  out.push(`  failed        ${pct(failed ? failed.rate : NaN)} of requests` +
    (checks ? `   checks ${pct(checks.rate)} (${group3(checks.passes)} passed, ${group3(checks.fails)} failed)` : ''));

  const lines = [];
  for (const [name, m] of Object.entries(data.metrics || {})) {
    for (const [expr, t] of Object.entries(m.thresholds || {})) {
      const ok = typeof t === 'object' && t !== null ? t.ok : !!t;
      lines.push(`    ${ok ? 'ok    ' : 'FAILED'} ${name} ${expr}`);
    }
  }
  if (lines.length > 0) out.push('  thresholds', ...lines.sort());
  out.push('');
  return out.join('\n');
}

// summaryOutputs is what handleSummary returns: the text on stdout and k6's
// whole summary object as JSON at SUMMARY, with a "rain" key saying what ran.
export function summaryOutputs(data, title, config) {
  const outputs = { stdout: textSummary(data, title) };
  if (SUMMARY !== '-') {
    outputs[SUMMARY] = JSON.stringify(Object.assign({}, data, { rain: { script: title, config } }), null, 2);
  }
  return outputs;
}
