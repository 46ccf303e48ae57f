// rain.js — the red-packet rain: an operator preloads a pool, then phones
// arrive in a spike far above the usual traffic, hold at the peak while the
// rain lasts, and fall away; late phones meet sold_out.
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e ADMIN_TOKEN=... -e RATE=20000 loadtest/k6/rain.js
//
// Arrivals are open-model (ramping-arrival-rate): a phone taps whether or not
// rain has answered the one before, so a slow rain shows up as latency and
// dropped iterations rather than as a politely lower rate.
//
// Env (all optional but ADMIN_TOKEN):
//   BASE_URL     rain instance(s), comma-separated  (http://127.0.0.1:8080)
//   ADMIN_TOKEN  rain's admin token, for the preload in setup() and the audit in teardown()
//   RATE         arrivals/s at the peak              (2000)
//   BASE_RATE    arrivals/s before and after the rain (RATE/20)
//   WARM         time at BASE_RATE before the spike   (10s)
//   RAMP         time the spike takes to rise and to fall (5s)
//   DURATION     time at the peak                     (30s)
//   COOL         time at BASE_RATE after the spike    (10s)
//   PRE_VUS      VUs allocated up front               (max(20, RATE/100))
//   MAX_VUS      VUs at most                          (max(PRE_VUS, RATE/10))
//   USERS        size of the user-id space: new users are PREFIX + (iteration mod USERS) (10000000)
//   REPEAT       share of grabs that re-send a user this VU sent before (0.2)
//   PACKETS      packets in the pool                  (1000000)
//   TOTAL_CENTS  cents in the pool                    (PACKETS × 500)
//   SUB_POOLS    sub-pools (0 = chosen by rain)       (0)
//   HOLD_SECONDS how long a grant waits for confirmation (0 = rain's 600)
//   START_IN     seconds from setup until the pool opens; grabs before that are not_started (0)
//   POOL         pool id to use; the same spec again is fine (200), another is not (409)
//   PREFIX       user id prefix                       (u)
//   P99_MS       threshold on grab p(99) in ms        (100)
//   MAX_FAILED   threshold on http_req_failed rate    (0.01)
//   MAX_DROPPED  threshold on dropped iterations, a share of the planned arrivals (0.01)
//   MAX_SHED     threshold on the share answered overloaded (0.05)
//   TIMEOUT      per-grab timeout                     (2s)
//   USER_SECRET_FILE  HS256 secret of rain serve --user-auth hs256:FILE: every grab
//                carries a user token signed with it (sub = its user id); unset: none
//   USER_AUDIENCE, USER_ISSUER  the tokens' aud and iss (--user-auth-audience, -issuer)
//   TOKEN_TTL    seconds each user token is valid    (3600)
//   AUDIT        0 skips the audit in teardown()      (1)
//   SUMMARY      JSON summary path, "-" for none      (summary.json)

import http from 'k6/http';
import exec from 'k6/execution';
import * as rain from './lib/rain.js';

const RATE = rain.envInt('RATE', 2000, 1);
const BASE_RATE = rain.envInt('BASE_RATE', Math.max(1, Math.round(RATE / 20)));
const WARM = rain.envDuration('WARM', '10s');
const RAMP = rain.envDuration('RAMP', '5s');
const DURATION = rain.envDuration('DURATION', '30s');
const COOL = rain.envDuration('COOL', '10s');
const PRE_VUS = rain.envInt('PRE_VUS', Math.max(20, Math.ceil(RATE / 100)), 1);
const MAX_VUS = rain.envInt('MAX_VUS', Math.max(PRE_VUS, Math.ceil(RATE / 10)), PRE_VUS);
const USERS = rain.envInt('USERS', 10000000, 1);
const REPEAT = rain.envFloat('REPEAT', 0.2, 0, 1);
const PACKETS = rain.envInt('PACKETS', 1000000, 1);
const TOTAL_CENTS = rain.envInt('TOTAL_CENTS', PACKETS * 500, 1);
const SUB_POOLS = rain.envInt('SUB_POOLS', 0);
const HOLD_SECONDS = rain.envInt('HOLD_SECONDS', 0);
const START_IN = rain.envInt('START_IN', 0);
const POOL = rain.poolFromEnv();
const P99_MS = rain.envFloat('P99_MS', 100, 0, 1e9);
const MAX_FAILED = rain.envFloat('MAX_FAILED', 0.01, 0, 1);
const MAX_DROPPED = rain.envFloat('MAX_DROPPED', 0.01, 0, 1);
const MAX_SHED = rain.envFloat('MAX_SHED', 0.05, 0, 1);
const AUDIT = rain.env('AUDIT', '1') !== '0';

// The shape of the rain: a drizzle, the spike, the peak, the fall, stragglers.
// Stages of zero length are left out.
const STAGES = [
  { duration: WARM, target: BASE_RATE },
  { duration: RAMP, target: RATE },
  { duration: DURATION, target: RATE },
  { duration: RAMP, target: BASE_RATE },
  { duration: COOL, target: BASE_RATE },
].filter((s) => rain.seconds(s.duration) > 0);

const PLANNED = rain.arrivals(BASE_RATE, STAGES);

export const options = {
  scenarios: {
    rain: {
      executor: 'ramping-arrival-rate',
      startRate: BASE_RATE,
      timeUnit: '1s',
      stages: STAGES,
      preAllocatedVUs: PRE_VUS,
      maxVUs: MAX_VUS,
      gracefulStop: '10s',
    },
  },
  thresholds: rain.grabThresholds({
    p99Ms: P99_MS,
    maxFailed: MAX_FAILED,
    abortAfter: '10s',
    maxDropped: Math.floor(PLANNED * MAX_DROPPED),
    checksRate: 0.99,
    maxShed: MAX_SHED,
  }),
  summaryTrendStats: rain.SUMMARY_TREND_STATS,
  setupTimeout: '5m',
  teardownTimeout: '5m',
};

// Every status of docs/api.md but invalid is an expected answer.
http.setResponseCallback(http.expectedStatuses(200, 404, 410, 425, 429, 503));

export function setup() {
  const { poolID, res } = rain.loadPool(POOL, 'rain-k6', {
    packets: PACKETS,
    totalCents: TOTAL_CENTS,
    subPools: SUB_POOLS,
    holdSeconds: HOLD_SECONDS,
    startIn: START_IN,
  });
  console.log(`pool ${poolID}: ${res.status === 201 ? 'loaded' : 'already loaded'}, ${PACKETS} packets, ` +
    `${TOTAL_CENTS} cents; ${PLANNED} arrivals planned, peak ${RATE}/s`);
  return { pool_id: poolID, planned: PLANNED };
}

// recent is this VU's memory of users it sent (module state is per VU).
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

// teardown reports what the rain left and audits the pool: after any load,
// stock + held + confirmed must still add up to what was preloaded.
export function teardown(data) {
  const st = rain.getPool(data.pool_id);
  const body = rain.parseJSON(st);
  if (st.status === 200 && body !== null) {
    console.log(`pool ${data.pool_id}: ${body.remaining_count} of ${body.count} packets left, ` +
      `${body.held_count} held, ${body.confirmed_count} confirmed`);
  }
  if (AUDIT) rain.checkAudit(rain.getAudit(data.pool_id));
}

export function handleSummary(data) {
  return rain.summaryOutputs(data, 'rain.js', {
    base_urls: rain.BASE_URLS, rate: RATE, base_rate: BASE_RATE, stages: STAGES, planned: PLANNED,
    users: USERS, repeat: REPEAT, packets: PACKETS, total_cents: TOTAL_CENTS, pre_vus: PRE_VUS, max_vus: MAX_VUS,
  });
}
