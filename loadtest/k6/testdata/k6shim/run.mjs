// run.mjs — plays one k6 script under node with the k6 stand-ins, the way
// k6 would, only smaller: the init context, setup(), ITERATIONS iterations of
// the first scenario's function on one VU, teardown(), then handleSummary()
// on a summary object shaped like k6's. It checks what k6 checks before a run
// (scenario and threshold options) and writes a JSON report for the Go test.
//
//   K6SHIM_ENV='{"BASE_URL":"..."}' node --import ./register.mjs run.mjs SCRIPT ITERATIONS REPORT
//
// Part of loadtest/k6check_test.go; not a load tool.
import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { state, BUILTIN } from './state.mjs';
import { close } from './http.mjs';

const [script, iterationsArg, reportPath] = process.argv.slice(2);
const iterations = Number(iterationsArg);
const report = { errors: [], logs: [] };

globalThis.__ENV = JSON.parse(process.env.K6SHIM_ENV || '{}');
// open() reads a file, in the init context only, as k6's does.
globalThis.open = (path) => {
  if (state.phase !== 'init') throw new Error('open() outside the init context');
  return readFileSync(path, 'utf8');
};
globalThis.__VU = 0;
globalThis.__ITER = 0;
for (const level of ['log', 'info', 'warn', 'error', 'debug']) {
  console[level] = (...args) => report.logs.push(args.map(String).join(' '));
}

// ---------------------------------------------------------------- options

const DURATION = /^(\d+(\.\d+)?(ms|h|m|s))+$/;
const COMMON = ['executor', 'startTime', 'gracefulStop', 'exec', 'env', 'tags', 'options'];
const EXECUTORS = {
  'shared-iterations': ['vus', 'iterations', 'maxDuration'],
  'per-vu-iterations': ['vus', 'iterations', 'maxDuration'],
  'constant-vus': ['vus', 'duration'],
  'ramping-vus': ['startVUs', 'stages', 'gracefulRampDown'],
  'constant-arrival-rate': ['duration', 'rate', 'timeUnit', 'preAllocatedVUs', 'maxVUs'],
  'ramping-arrival-rate': ['startRate', 'timeUnit', 'stages', 'preAllocatedVUs', 'maxVUs'],
};
const REQUIRED = {
  'constant-arrival-rate': ['duration', 'rate', 'preAllocatedVUs'],
  'ramping-arrival-rate': ['stages', 'preAllocatedVUs'],
  'shared-iterations': [],
  'per-vu-iterations': [],
  'constant-vus': ['duration'],
  'ramping-vus': ['stages'],
};
const OPTIONS = new Set(['scenarios', 'thresholds', 'summaryTrendStats', 'setupTimeout', 'teardownTimeout',
  'discardResponseBodies', 'noConnectionReuse', 'userAgent', 'tags', 'insecureSkipTLSVerify', 'batch', 'batchPerHost']);

function isWhole(v, min) {
  return Number.isInteger(v) && v >= min;
}

// checkOptions reports what k6 would refuse: unknown options, unknown or
// missing executor fields (k6 reads scenarios strictly), bad durations.
function checkOptions(o) {
  const errs = [];
  for (const k of Object.keys(o)) if (!OPTIONS.has(k)) errs.push(`option ${k} is not one the test knows to be k6's`);
  for (const k of ['setupTimeout', 'teardownTimeout']) {
    if (o[k] !== undefined && !DURATION.test(o[k])) errs.push(`${k} ${o[k]}: not a duration`);
  }
  const scenarios = Object.entries(o.scenarios || {});
  if (scenarios.length === 0) errs.push('no scenarios');
  for (const [name, sc] of scenarios) {
    const allowed = EXECUTORS[sc.executor];
    if (!allowed) {
      errs.push(`scenario ${name}: unknown executor ${sc.executor}`);
      continue;
    }
    for (const k of Object.keys(sc)) if (!COMMON.includes(k) && !allowed.includes(k)) errs.push(`scenario ${name}: ${sc.executor} has no field ${k}`);
    for (const k of REQUIRED[sc.executor]) if (sc[k] === undefined) errs.push(`scenario ${name}: ${sc.executor} needs ${k}`);
    for (const k of ['duration', 'timeUnit', 'gracefulStop', 'maxDuration', 'startTime']) {
      if (sc[k] !== undefined && !DURATION.test(sc[k])) errs.push(`scenario ${name}: ${k} ${sc[k]}: not a duration`);
    }
    for (const k of ['rate', 'preAllocatedVUs', 'vus', 'iterations']) {
      if (sc[k] !== undefined && !isWhole(sc[k], 1)) errs.push(`scenario ${name}: ${k} ${sc[k]}: want a whole number ≥ 1`);
    }
    if (sc.startRate !== undefined && !isWhole(sc.startRate, 0)) errs.push(`scenario ${name}: startRate ${sc.startRate}`);
    if (sc.maxVUs !== undefined && !(isWhole(sc.maxVUs, 1) && sc.maxVUs >= (sc.preAllocatedVUs || 0))) {
      errs.push(`scenario ${name}: maxVUs ${sc.maxVUs} below preAllocatedVUs ${sc.preAllocatedVUs}`);
    }
    if (sc.stages !== undefined) {
      if (!Array.isArray(sc.stages) || sc.stages.length === 0) errs.push(`scenario ${name}: stages empty`);
      for (const st of sc.stages || []) {
        const keys = Object.keys(st).sort().join(',');
        if (keys !== 'duration,target' || !DURATION.test(st.duration) || !isWhole(st.target, 0)) {
          errs.push(`scenario ${name}: bad stage ${JSON.stringify(st)}`);
        }
      }
    }
  }
  return errs;
}

// ------------------------------------------------------------- thresholds

const AGG = { counter: ['count', 'rate'], gauge: ['value'], rate: ['rate'], trend: ['avg', 'min', 'max', 'med'] };
const EXPR = /^\s*(count|rate|value|avg|min|max|med|p\((\d+(?:\.\d+)?)\))\s*(<=|>=|===|==|!=|<|>)\s*(-?\d+(?:\.\d+)?)\s*$/;

// parseKey splits "metric{tag:value,...}" into the metric and its tag filter.
function parseKey(key) {
  const m = /^([^{}]+?)(?:\{([^{}]*)\})?$/.exec(key);
  if (!m) return null;
  const tags = {};
  for (const part of (m[2] || '').split(',').filter((p) => p.trim() !== '')) {
    const i = part.indexOf(':');
    if (i < 0) return null;
    tags[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return { metric: m[1].trim(), tags };
}

function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  const i = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(i);
  return lo + 1 < sorted.length ? sorted[lo] + (sorted[lo + 1] - sorted[lo]) * (i - lo) : sorted[lo];
}

function aggregate(type, samples, durationS, stat) {
  const vs = samples.map((s) => s.value);
  switch (type) {
    case 'counter': {
      const count = vs.reduce((a, b) => a + b, 0);
      return { count, rate: count / durationS };
    }
    case 'gauge':
      return { value: vs.length ? vs[vs.length - 1] : 0, min: Math.min(...vs, 0), max: Math.max(...vs, 0) };
    case 'rate': {
      const passes = vs.filter((v) => v !== 0).length;
      return { rate: vs.length ? passes / vs.length : NaN, passes, fails: vs.length - passes };
    }
    default: {
      const sorted = vs.slice().sort((a, b) => a - b);
      const all = {
        avg: vs.length ? vs.reduce((a, b) => a + b, 0) / vs.length : 0,
        min: sorted.length ? sorted[0] : 0, max: sorted.length ? sorted[sorted.length - 1] : 0,
        med: percentile(sorted, 50), count: vs.length,
      };
      const out = {};
      for (const s of stat) {
        const p = /^p\((\d+(?:\.\d+)?)\)$/.exec(s);
        out[s] = p ? percentile(sorted, Number(p[1])) : all[s];
      }
      out.__sorted = sorted;
      return out;
    }
  }
}

function compare(a, op, b) {
  switch (op) {
    case '<': return a < b;
    case '<=': return a <= b;
    case '>': return a > b;
    case '>=': return a >= b;
    case '!=': return a !== b;
    default: return a === b;
  }
}

// -------------------------------------------------------------------- run

function fail(where, e) {
  report.errors.push(`${where}: ${e && e.stack ? e.stack : e}`);
}

async function main() {
  let mod;
  try {
    mod = await import(pathToFileURL(script).href);
  } catch (e) {
    return fail('init', e);
  }
  const options = mod.options || {};
  report.options = options;
  report.exports = Object.keys(mod).sort();
  report.errors.push(...checkOptions(options));
  const [scenario, sc] = Object.entries(options.scenarios || {})[0] || ['default', {}];
  state.scenario = scenario;
  state.executor = sc.executor || '';
  const fn = mod[sc.exec || 'default'];
  if (typeof fn !== 'function') return fail('init', `no function ${sc.exec || 'default'} to run`);

  const started = Date.now();
  let data;
  state.phase = 'setup';
  try {
    // k6 hands setup's result to every VU as a JSON copy.
    data = mod.setup ? JSON.parse(JSON.stringify(mod.setup() ?? null)) : undefined;
  } catch (e) {
    return fail('setup', e);
  }
  report.setupData = data;

  state.phase = 'vu';
  for (let i = 0; i < iterations; i++) {
    state.iteration = i;
    globalThis.__ITER = i;
    globalThis.__VU = 1;
    try {
      fn(data);
    } catch (e) {
      fail(`iteration ${i}`, e);
    }
    report.iterations = i + 1;
  }
  state.phase = 'teardown';
  globalThis.__VU = 0;
  try {
    if (mod.teardown) mod.teardown(data);
  } catch (e) {
    fail('teardown', e);
  }
  const durationS = Math.max(0.001, (Date.now() - started) / 1000);

  // The summary object, shaped like k6's: metrics with type, contains,
  // values (trend statistics as summaryTrendStats asks) and thresholds.
  state.phase = 'summary';
  const stats = options.summaryTrendStats || ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)'];
  const metrics = {};
  const custom = {};
  for (const [name, m] of state.metrics) {
    if (!Object.hasOwn(BUILTIN, name)) custom[name] = m.type;
    const values = aggregate(m.type, m.samples, durationS, stats);
    delete values.__sorted;
    metrics[name] = { type: m.type, contains: m.isTime || BUILTIN[name] === 'trend' ? 'time' : 'default', values };
  }
  metrics.iterations = { type: 'counter', contains: 'default', values: { count: iterations, rate: iterations / durationS } };
  report.customMetrics = custom;

  report.thresholds = {};
  for (const [key, list] of Object.entries(options.thresholds || {})) {
    const k = parseKey(key);
    const type = k && (BUILTIN[k.metric] || (state.metrics.get(k.metric) || {}).type);
    if (!type) {
      report.errors.push(`threshold on ${key}: no such metric (k6 refuses to start)`);
      continue;
    }
    const samples = (state.metrics.get(k.metric) || { samples: [] }).samples
      .filter((s) => Object.entries(k.tags).every(([t, v]) => s.tags[t] === v));
    const thresholds = {};
    for (const entry of Array.isArray(list) ? list : [list]) {
      const t = typeof entry === 'string' ? { threshold: entry } : entry;
      const extra = Object.keys(t).filter((x) => !['threshold', 'abortOnFail', 'delayAbortEval'].includes(x));
      if (extra.length > 0) report.errors.push(`threshold on ${key}: unknown fields ${extra}`);
      if (t.delayAbortEval !== undefined && !DURATION.test(t.delayAbortEval)) report.errors.push(`threshold on ${key}: delayAbortEval ${t.delayAbortEval}`);
      const e = EXPR.exec(t.threshold || '');
      const agg = e && (e[2] !== undefined ? 'p' : e[1]);
      if (!e || !(AGG[type].includes(agg) || (type === 'trend' && agg === 'p'))) {
        report.errors.push(`threshold on ${key}: ${t.threshold} does not fit a ${type} metric`);
        continue;
      }
      const v = aggregate(type, samples, durationS, e[2] !== undefined ? [`p(${e[2]})`] : ['avg', 'min', 'max', 'med']);
      const got = e[2] !== undefined ? v[`p(${e[2]})`] : v[e[1]];
      thresholds[t.threshold] = { ok: compare(got, e[3], Number(e[4])) };
      report.thresholds[`${key} ${t.threshold}`] = { ok: thresholds[t.threshold].ok, value: got };
    }
    const values = aggregate(type, samples, durationS, stats);
    delete values.__sorted;
    metrics[key] = Object.assign(metrics[key] || { type, contains: type === 'trend' ? 'time' : 'default', values }, { thresholds });
  }

  report.checks = {};
  for (const s of (state.metrics.get('checks') || { samples: [] }).samples) {
    const c = report.checks[s.tags.check] || (report.checks[s.tags.check] = { passes: 0, fails: 0 });
    if (s.value) c.passes++;
    else c.fails++;
  }
  report.counters = {};
  for (const [name, m] of state.metrics) {
    if (m.type === 'counter') report.counters[name] = m.samples.reduce((a, s) => a + s.value, 0);
  }
  report.failedRequests = (state.metrics.get('http_req_failed') || { samples: [] }).samples.filter((s) => s.value).length;

  if (mod.handleSummary) {
    try {
      report.summary = mod.handleSummary({
        metrics,
        root_group: { name: '', path: '', id: 'd41d8cd98f00b204e9800998ecf8427e', groups: [], checks: [] },
        options: { summaryTrendStats: stats, summaryTimeUnit: '', noColor: true },
        state: { isStdOutTTY: false, isStdErrTTY: false, testRunDurationMs: durationS * 1000 },
        setup_data: data,
      });
    } catch (e) {
      fail('handleSummary', e);
    }
  }
}

try {
  await main();
} finally {
  writeFileSync(reportPath, JSON.stringify(report, null, 2));
  await close();
}
