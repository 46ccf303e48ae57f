// state.mjs — what the k6 stand-ins share with run.mjs: the phase of the
// test life cycle, the iteration, and every metric sample.
export const state = {
  phase: 'init', // init, setup, vu, teardown, summary
  scenario: '', // name of the scenario run
  executor: '',
  iteration: 0, // exec.scenario.iterationInTest
  responseCallback: undefined, // set by http.setResponseCallback; undefined = default
  metrics: new Map(), // name -> {type, isTime, samples: [{value, tags}]}
};

// BUILTIN are k6's built-in metrics and their types.
export const BUILTIN = {
  http_reqs: 'counter', iterations: 'counter', dropped_iterations: 'counter',
  data_sent: 'counter', data_received: 'counter',
  http_req_failed: 'rate', checks: 'rate',
  http_req_duration: 'trend', http_req_blocked: 'trend', http_req_connecting: 'trend',
  http_req_tls_handshaking: 'trend', http_req_sending: 'trend', http_req_waiting: 'trend',
  http_req_receiving: 'trend', iteration_duration: 'trend', group_duration: 'trend',
  vus: 'gauge', vus_max: 'gauge',
};

export function declare(name, type, isTime = false) {
  if (!state.metrics.has(name)) state.metrics.set(name, { type, isTime, samples: [] });
  return state.metrics.get(name);
}

export function sample(name, value, tags = {}) {
  const m = state.metrics.get(name) || declare(name, BUILTIN[name] || 'counter');
  m.samples.push({ value: Number(value), tags: Object.assign({ scenario: state.scenario }, tags) });
}
