// soak.js — a steady rate for a long time: what leaks, drifts or slows down
// only after many minutes (heap, connections, serial segments, Redis memory).
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e ADMIN_TOKEN=... -e RATE=1000 -e DURATION=2h loadtest/k6/soak.js
//
// Same grab and checks as rain.js, at a constant arrival rate, against a pool
// large enough not to sell out (a soak measures the grant path, not sold_out),
// with stricter thresholds: at a rate rain can hold, it must hold it evenly.
//
// Env (all optional but ADMIN_TOKEN):
//   BASE_URL     rain instance(s), comma-separated  (http://127.0.0.1:8080)
//   ADMIN_TOKEN  rain's admin token
//   RATE         arrivals/s                           (500)
//   DURATION     length of the run                    (30m)
//   PRE_VUS      VUs allocated up front               (max(10, RATE/100))
//   MAX_VUS      VUs at most                          (max(PRE_VUS, RATE/10))
//   USERS        size of the user-id space            (1000000000)
//   REPEAT       share of repeat grabs                (0.2)
//   PACKETS      packets in the pool                  (RATE × DURATION: every arrival could be new)
//   TOTAL_CENTS  cents in the pool                    (PACKETS × 500)
//   SUB_POOLS, HOLD_SECONDS, POOL, PREFIX, TIMEOUT, AUDIT, SUMMARY,
//   USER_SECRET_FILE, USER_AUDIENCE, USER_ISSUER, TOKEN_TTL: as in rain.js
//   P99_MS       threshold on grab p(99) in ms        (50)
//   MAX_FAILED   threshold on http_req_failed rate    (0.001)
//   MAX_DROPPED  threshold on dropped iterations, a share of the planned arrivals (0.001)
//   MAX_SHED     threshold on the share answered overloaded (0.001)

import http from 'k6/http';
import exec from 'k6/execution';
import * as rain from './lib/rain.js';

const RATE = rain.envInt('RATE', 500, 1);
const DURATION = rain.envDuration('DURATION', '30m');
const PRE_VUS = rain.envInt('PRE_VUS', Math.max(10, Math.ceil(RATE / 100)), 1);
const MAX_VUS = rain.envInt('MAX_VUS', Math.max(PRE_VUS, Math.ceil(RATE / 10)), PRE_VUS);
const USERS = rain.envInt('USERS', 1000000000, 1);
const REPEAT = rain.envFloat('REPEAT', 0.2, 0, 1);
const PLANNED = Math.round(RATE * rain.seconds(DURATION));
const PACKETS = rain.envInt('PACKETS', Math.max(1000, PLANNED), 1);
const TOTAL_CENTS = rain.envInt('TOTAL_CENTS', PACKETS * 500, 1);
const SUB_POOLS = rain.envInt('SUB_POOLS', 0);
const HOLD_SECONDS = rain.envInt('HOLD_SECONDS', 0);
const POOL = rain.poolFromEnv();
const P99_MS = rain.envFloat('P99_MS', 50, 0, 1e9);
const MAX_FAILED = rain.envFloat('MAX_FAILED', 0.001, 0, 1);
const MAX_DROPPED = rain.envFloat('MAX_DROPPED', 0.001, 0, 1);
const MAX_SHED = rain.envFloat('MAX_SHED', 0.001, 0, 1);
const AUDIT = rain.env('AUDIT', '1') !== '0';

export const options = {
  scenarios: {
    soak: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: DURATION,
      preAllocatedVUs: PRE_VUS,
      maxVUs: MAX_VUS,
      gracefulStop: '10s',
    },
  },
  thresholds: rain.grabThresholds({
    p99Ms: P99_MS,
    maxFailed: MAX_FAILED,
    abortAfter: '1m',
    maxDropped: Math.floor(PLANNED * MAX_DROPPED),
    checksRate: 0.999,
    maxShed: MAX_SHED,
  }),
  summaryTrendStats: rain.SUMMARY_TREND_STATS,
  setupTimeout: '10m',
  teardownTimeout: '10m',
};

http.setResponseCallback(http.expectedStatuses(200, 404, 410, 425, 429, 503));

export function setup() {
  const { poolID, res } = rain.loadPool(POOL, 'soak-k6', {
    packets: PACKETS,
    totalCents: TOTAL_CENTS,
    subPools: SUB_POOLS,
    holdSeconds: HOLD_SECONDS,
  });
  console.log(`pool ${poolID}: ${res.status === 201 ? 'loaded' : 'already loaded'}, ${PACKETS} packets; ` +
    `${RATE}/s for ${DURATION}`);
  return { pool_id: poolID, planned: PLANNED };
}

const recent = new rain.Recent(256);

export default function (data) {
  rain.grabOnce({
    poolID: data.pool_id,
    iteration: exec.scenario.iterationInTest,
    users: USERS,
    repeat: REPEAT,
    recent,
  });
}

export function teardown(data) {
  if (AUDIT) rain.checkAudit(rain.getAudit(data.pool_id));
}

export function handleSummary(data) {
  return rain.summaryOutputs(data, 'soak.js', {
    base_urls: rain.BASE_URLS, rate: RATE, duration: DURATION, planned: PLANNED,
    users: USERS, repeat: REPEAT, packets: PACKETS, total_cents: TOTAL_CENTS, pre_vus: PRE_VUS, max_vus: MAX_VUS,
  });
}
