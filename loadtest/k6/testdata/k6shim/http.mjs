// http.mjs — stand-in for k6/http with real, blocking HTTP like k6's: each
// request is sent by fetch on a worker thread while this thread waits on an
// Atomics flag, then reads the answer with receiveMessageOnPort.
import { Worker, MessageChannel, receiveMessageOnPort } from 'node:worker_threads';
import { state, sample } from './state.mjs';

const flag = new Int32Array(new SharedArrayBuffer(4));
const { port1, port2 } = new MessageChannel();
const worker = new Worker(`
  const { workerData } = require('node:worker_threads');
  const { port, flag } = workerData;
  port.on('message', async (req) => {
    let res;
    try {
      const r = await fetch(req.url, {
        method: req.method, headers: req.headers, body: req.body === null ? undefined : req.body,
        signal: AbortSignal.timeout(req.timeoutMs),
      });
      const headers = {};
      r.headers.forEach((v, k) => { headers[k] = v; });
      res = { status: r.status, headers, body: await r.text() };
    } catch (e) {
      res = { status: 0, headers: {}, body: null, error: String(e && e.cause ? e.cause : e) };
    }
    port.postMessage(res);
    Atomics.store(flag, 0, 1);
    Atomics.notify(flag, 0);
  });
`, { eval: true, workerData: { port: port2, flag }, transferList: [port2] });

// close ends the worker so that node can exit.
export function close() {
  port1.close();
  return worker.terminate();
}

const DEFAULT_EXPECTED = { expected: [{ min: 200, max: 399 }] };

export function expectedStatuses(...statuses) {
  for (const s of statuses) {
    const ok = Number.isInteger(s) || (s && Number.isInteger(s.min) && Number.isInteger(s.max));
    if (!ok) throw new Error(`expectedStatuses(${JSON.stringify(s)}): want integers or {min, max}`);
  }
  return { expected: statuses };
}

export function setResponseCallback(cb) {
  if (cb !== null && !(cb && Array.isArray(cb.expected))) throw new Error('setResponseCallback: want expectedStatuses(...) or null');
  state.responseCallback = cb;
}

function isExpected(cb, status) {
  return cb.expected.some((s) => (Number.isInteger(s) ? s === status : s.min <= status && status <= s.max));
}

// timeoutMs reads a k6 timeout: a duration string or milliseconds.
function timeoutMs(t) {
  if (t === undefined) return 60000;
  if (typeof t === 'number') return t;
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)$/.exec(t);
  if (!m) throw new Error(`timeout ${t}: want a duration such as 2s or a number of ms`);
  return Number(m[1]) * { ms: 1, s: 1000, m: 60000 }[m[2]];
}

function canonical(name) {
  return name.split('-').map((w) => w.charAt(0).toUpperCase() + w.slice(1).toLowerCase()).join('-');
}

const PARAMS = new Set(['headers', 'tags', 'timeout', 'responseCallback', 'redirects', 'responseType', 'auth', 'cookies', 'jar', 'compression']);

export function request(method, url, body = null, params = {}) {
  if (state.phase === 'init') throw new Error(`${method} ${url} in the init context`);
  for (const k of Object.keys(params)) if (!PARAMS.has(k)) throw new Error(`${method} ${url}: unknown param ${k}`);
  if (body !== null && typeof body !== 'string') throw new Error(`${method} ${url}: the shim sends string bodies only`);
  const headers = Object.assign({}, params.headers);
  const ms = timeoutMs(params.timeout);
  const start = performance.now();
  Atomics.store(flag, 0, 0);
  port1.postMessage({ method, url, headers, body, timeoutMs: ms });
  if (Atomics.wait(flag, 0, 0, ms + 10000) === 'timed-out') throw new Error(`${method} ${url}: the shim's worker did not answer`);
  const msg = receiveMessageOnPort(port1).message;
  const duration = performance.now() - start;

  const res = {
    status: msg.status,
    body: msg.body,
    error: msg.error || '',
    error_code: msg.error ? 1000 : 0,
    url,
    headers: {},
    timings: { duration },
    request: { method, url, body, headers },
    json(selector) {
      if (selector !== undefined) throw new Error('the shim has no json(selector)');
      if (this.body === null) throw new Error('no body');
      return JSON.parse(this.body);
    },
  };
  for (const [k, v] of Object.entries(msg.headers)) res.headers[canonical(k)] = v;

  const cb = Object.hasOwn(params, 'responseCallback') ? params.responseCallback
    : state.responseCallback === undefined ? DEFAULT_EXPECTED : state.responseCallback;
  const tags = Object.assign({ name: url, method, status: String(msg.status) }, params.tags);
  if (cb !== null) {
    const expected = isExpected(cb, msg.status);
    tags.expected_response = String(expected);
    sample('http_req_failed', expected ? 0 : 1, tags);
  }
  sample('http_reqs', 1, tags);
  sample('http_req_duration', duration, tags);
  return res;
}

export function get(url, params) {
  return request('GET', url, null, params);
}

export function post(url, body, params) {
  return request('POST', url, body, params);
}

export default { request, get, post, expectedStatuses, setResponseCallback };
