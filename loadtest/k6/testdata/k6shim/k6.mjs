// k6.mjs — stand-in for the k6 module: check, sleep, group, fail.
import { state, sample } from './state.mjs';

// check runs each predicate on val like k6: an exception inside one is not
// caught (k6 aborts the iteration), a non-function value counts by truthiness.
export function check(val, sets, tags = {}) {
  if (state.phase === 'init') throw new Error('check() in the init context');
  let all = true;
  for (const [name, p] of Object.entries(sets)) {
    const ok = typeof p === 'function' ? !!p(val) : !!p;
    sample('checks', ok ? 1 : 0, Object.assign({ check: name }, tags));
    all = all && ok;
  }
  return all;
}

export function sleep(secs) {
  if (typeof secs !== 'number' || !(secs >= 0)) throw new Error(`sleep(${secs}): want seconds`);
  // The shim does not wait: only what the scripts do matters here.
}

export function group(name, fn) {
  return fn();
}

export function fail(msg) {
  throw new Error(msg);
}

export function randomSeed() {}

export default { check, sleep, group, fail, randomSeed };
