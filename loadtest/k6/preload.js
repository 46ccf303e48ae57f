// preload.js — operators loading pools before a campaign: POOLS pools of
// PACKETS packets each, VUS at a time, each checked the way an operator would.
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e ADMIN_TOKEN=... -e POOLS=20 -e PACKETS=1000000 loadtest/k6/preload.js
//
// For each pool: without the token rain answers 401 and loads nothing; the
// preload answers 201; the status shows every packet in stock; the audit is
// ok; the same spec again answers 200 (idempotent) and another spec under the
// same id 409. rain_preload_packets_per_s is the loading speed.
//
// Env (all optional but ADMIN_TOKEN):
//   BASE_URL     rain instance; operator calls go to the first (http://127.0.0.1:8080)
//   ADMIN_TOKEN  rain's admin token
//   POOLS        pools to load                        (10)
//   PACKETS      packets per pool                     (100000)
//   TOTAL_CENTS  cents per pool                       (PACKETS × 500)
//   SUB_POOLS    sub-pools per pool (0 = chosen by rain) (0)
//   VUS          operators loading at once            (min(POOLS, 4))
//   POOL         pool id prefix; pools are POOL-0, POOL-1, ... (fresh per run)
//   P99_MS       threshold on the preload p(99) in ms (30000)
//   SUMMARY      JSON summary path, "-" for none      (summary.json)

import http from 'k6/http';
import { check } from 'k6';
import exec from 'k6/execution';
import * as rain from './lib/rain.js';

const POOLS = rain.envInt('POOLS', 10, 1);
const PACKETS = rain.envInt('PACKETS', 100000, 1);
const TOTAL_CENTS = rain.envInt('TOTAL_CENTS', PACKETS * 500, 1);
const SUB_POOLS = rain.envInt('SUB_POOLS', 0);
const VUS = rain.envInt('VUS', Math.min(POOLS, 4), 1);
const POOL = rain.poolFromEnv();
const P99_MS = rain.envFloat('P99_MS', 30000, 0, 1e9);

export const options = {
  scenarios: {
    operators: {
      executor: 'shared-iterations',
      vus: VUS,
      iterations: POOLS,
      maxDuration: '1h',
    },
  },
  thresholds: {
    // Every operator call answers as the contract says, 401 and 409 included
    // (those requests carry their own expected status).
    checks: ['rate==1'],
    http_req_failed: ['rate==0'],
    'http_req_duration{endpoint:preload}': [`p(99)<${P99_MS}`],
  },
  summaryTrendStats: rain.SUMMARY_TREND_STATS,
  setupTimeout: '1m',
};

export function setup() {
  rain.waitReady();
  if (rain.ADMIN_TOKEN === '') throw new Error('ADMIN_TOKEN is empty: give rain\'s admin token (k6 run -e ADMIN_TOKEN=...)');
  return { prefix: POOL || rain.newPoolID('preload-k6') };
}

const NO_TOKEN = {
  headers: { 'Content-Type': 'application/json', Authorization: 'Bearer not-the-token' },
  tags: { name: 'POST /admin/pools', endpoint: 'preload' },
  responseCallback: rain.EXPECT_401,
};

export default function (data) {
  const poolID = `${data.prefix}-${exec.scenario.iterationInTest}`;
  const spec = rain.poolSpec({ poolID, packets: PACKETS, totalCents: TOTAL_CENTS, subPools: SUB_POOLS });

  // Without a valid token: 401, and nothing is done (the load below is a 201).
  const denied = http.post(`${rain.BASE_URL}/admin/pools`, JSON.stringify(spec), NO_TOKEN);
  check(denied, { 'preload without the token: 401': (r) => r.status === 401 });

  const start = Date.now();
  const res = rain.postPool(spec);
  const loaded = check(res, { 'preload: 201 created': (r) => r.status === 201 });
  if (loaded) rain.preloadRate.add(PACKETS / Math.max(0.001, (Date.now() - start) / 1000));

  const st = rain.getPool(poolID);
  const body = rain.parseJSON(st);
  check(st, {
    'status: 200': (r) => r.status === 200,
    'status: the spec loaded': () => body !== null && body.pool_id === poolID && body.count === PACKETS &&
      body.total_cents === TOTAL_CENTS,
    'status: every packet in stock': () => body !== null && body.remaining_count === PACKETS &&
      body.remaining_cents === TOTAL_CENTS && body.held_count === 0 && body.confirmed_count === 0,
    'status: sub-pools add up': () => body !== null && Array.isArray(body.sub_pools) && body.sub_pools.length > 0 &&
      body.sub_pools.reduce((n, s) => n + s.remaining_count, 0) === body.remaining_count,
  });

  rain.checkAudit(rain.getAudit(poolID));

  const again = rain.postPool(spec);
  check(again, { 'preload again, same spec: 200': (r) => r.status === 200 });

  const other = Object.assign({}, spec, { total_cents: spec.total_cents + 1 });
  const conflict = rain.postPool(other, { responseCallback: rain.EXPECT_409 });
  check(conflict, { 'preload again, another spec: 409': (r) => r.status === 409 });
}

export function handleSummary(data) {
  return rain.summaryOutputs(data, 'preload.js', {
    base_url: rain.BASE_URL, pools: POOLS, packets: PACKETS, total_cents: TOTAL_CENTS, sub_pools: SUB_POOLS, vus: VUS,
  });
}
