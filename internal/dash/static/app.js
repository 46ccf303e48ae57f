// rain's dashboard: polls the operator API once a second and draws what it
// reads. The admin token is asked once and kept in sessionStorage (this
// tab only); it travels in the Authorization header, never in a URL.
"use strict";

const KEY = "rain.adminToken";
const COLORS = { granted: "#2e7d32", already_granted: "#7cb342", sold_out: "#6d4c41",
  overloaded: "#d23f31", not_found: "#8e24aa", not_started: "#f9a825", ended: "#546e7a",
  invalid: "#fb8c00", unauthorized: "#ad1457", rate_limited: "#00838f", error: "#000",
  p50: "#1565c0", p99: "#d23f31" };
const $ = (id) => document.getElementById(id);

let token = sessionStorage.getItem(KEY) || "";
let selected = "";
let points = [];
let timer = 0;

// api fetches an operator endpoint with the token; a 401 sends the user back
// to the token form with the error.
async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
  if (r.status === 401) {
    throw Object.assign(new Error("wrong admin token"), { unauthorized: true });
  }
  const body = await r.json();
  if (!r.ok) {
    throw new Error(body.error || path + " answered " + r.status);
  }
  return body;
}

function showLogin(message) {
  clearInterval(timer);
  timer = 0;
  $("board").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("live").textContent = "not connected";
  $("login-error").hidden = !message;
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function open() {
  try {
    await api("/admin/pools");
  } catch (e) {
    token = "";
    sessionStorage.removeItem(KEY);
    showLogin(e.unauthorized ? "Wrong admin token: try again." : "Cannot reach rain: " + e.message);
    return;
  }
  sessionStorage.setItem(KEY, token);
  $("login").hidden = true;
  $("board").hidden = false;
  $("logout").hidden = false;
  await tick();
  timer = setInterval(tick, 1000);
}

async function tick() {
  try {
    const since = points.length ? points[points.length - 1].at : "";
    const [stats, pools] = await Promise.all([
      api("/admin/stats" + (since ? "?since=" + encodeURIComponent(since) : "")),
      api("/admin/pools"),
    ]);
    points = points.concat(stats.points).slice(-300);
    drawService();
    drawPools(pools.pools);
    if (selected) {
      drawPool(await api("/admin/pools/" + encodeURIComponent(selected)));
    }
    $("error").hidden = true;
    $("live").textContent = "live · " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.unauthorized) {
      token = "";
      sessionStorage.removeItem(KEY);
      showLogin("The admin token was refused: enter it again.");
      return;
    }
    $("error").hidden = false;
    $("error").textContent = e.message;
  }
}

const fmt = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const money = (cents) => (cents / 100).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });

function total(p) {
  return Object.values(p.grabs).reduce((a, b) => a + b, 0);
}

function drawService() {
  const last = points[points.length - 1];
  if (!last) return;
  $("rate").textContent = fmt(Math.round(total(last)));
  $("latency").textContent = last.p50_ms == null ? "–" : last.p50_ms.toFixed(2) + " / " + last.p99_ms.toFixed(2) + " ms";
  $("shed").textContent = fmt(Math.round(last.shed));
  $("workers").textContent = fmt(last.pool_running) + " running of " + fmt(last.pool_capacity);
  $("reaper").textContent = (last.reaper_leader ? "leading" : "not leading here") + ", lag " + last.reaper_lag_seconds.toFixed(1) + " s";
  $("breakers").textContent = last.breakers_open.length ? last.breakers_open.join(", ") : "none";

  // Statuses that were answered at all in the window, each a line.
  const statuses = [...new Set(points.flatMap((p) => Object.keys(p.grabs).filter((s) => p.grabs[s] > 0)))].sort();
  chart($("chart-rate"), $("legend-rate"), statuses.map((s) => ({ name: s, color: COLORS[s] || "#999", values: points.map((p) => p.grabs[s] || 0) })));
  chart($("chart-latency"), $("legend-latency"), [
    { name: "p50", color: COLORS.p50, values: points.map((p) => p.p50_ms) },
    { name: "p99", color: COLORS.p99, values: points.map((p) => p.p99_ms) },
  ]);
}

// chart draws series of values (one per second, null for none) as lines.
function chart(canvas, legend, series) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, h);
  let max = 0;
  for (const s of series) for (const v of s.values) if (v != null && v > max) max = v;
  max = max > 0 ? max * 1.1 : 1;
  ctx.strokeStyle = "#e3e5e8";
  ctx.fillStyle = "#6b7380";
  ctx.font = "10px sans-serif";
  for (let i = 0; i <= 4; i++) {
    const y = pad / 2 + (h - pad) * i / 4;
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(formatTick(max * (4 - i) / 4), 0, y + 3);
  }
  const n = Math.max(2, points.length);
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v == null) { pen = false; return; }
      const x = pad + (w - pad) * i / (n - 1);
      const y = pad / 2 + (h - pad) * (1 - v / max);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
  }
  canvas.dataset.points = String(points.length);
  legend.innerHTML = "";
  for (const s of series) {
    const span = document.createElement("span");
    const i = document.createElement("i");
    i.style.background = s.color;
    span.append(i, s.name);
    legend.append(span);
  }
}

function formatTick(v) {
  return v >= 1000 ? (v / 1000).toFixed(1) + "k" : v >= 10 ? v.toFixed(0) : v.toFixed(1);
}

function drawPools(ids) {
  const list = $("pool-list");
  $("pools-empty").hidden = ids.length > 0;
  const have = [...list.querySelectorAll("button")].map((b) => b.dataset.pool).join("\n");
  if (have !== ids.join("\n")) {
    list.innerHTML = "";
    for (const id of ids) {
      const li = document.createElement("li");
      const b = document.createElement("button");
      b.textContent = id;
      b.dataset.pool = id;
      b.addEventListener("click", () => { selected = id; $("audit-result").textContent = ""; tick(); });
      li.append(b);
      list.append(li);
    }
  }
  for (const b of list.querySelectorAll("button")) b.classList.toggle("selected", b.dataset.pool === selected);
}

// fromAccount shows a closed pool's final account as a status: what was
// left unclaimed (back to the campaign) as its remaining stock; what no
// account keeps (held, released, shards) as a dash.
function fromAccount(a) {
  return {
    pool_id: a.pool_id, state: a.state, count: a.preloaded_count, total_cents: a.preloaded_cents,
    remaining_count: a.unclaimed_count, remaining_cents: a.unclaimed_cents,
    held_count: 0, held_cents: 0, confirmed_count: a.confirmed_count, confirmed_cents: a.confirmed_cents,
    released_count: null, released_cents: null,
    sub_pools: a.sub_pools.map((sp) => ({
      index: sp.index, shard: "—", count: sp.confirmed_count + sp.unclaimed_count,
      total_cents: sp.confirmed_cents + sp.unclaimed_cents,
      remaining_count: sp.unclaimed_count, remaining_cents: sp.unclaimed_cents,
    })),
  };
}

function drawPool(st) {
  if (st.state === "closed" || st.state === "closing") st = fromAccount(st);
  $("pool").hidden = false;
  $("pool").dataset.pool = st.pool_id;
  $("pool-id").textContent = st.pool_id;
  $("pool-state").textContent = st.state;
  const pct = st.count > 0 ? (100 * st.remaining_count) / st.count : 0;
  $("pool-bar").style.width = pct.toFixed(2) + "%";
  $("pool-bar").dataset.remaining = String(st.remaining_count);
  $("pool-remaining").textContent = fmt(st.remaining_count) + " of " + fmt(st.count) + " packets left · " +
    money(st.remaining_cents) + " of " + money(st.total_cents);
  for (const k of ["remaining", "held", "confirmed", "released"]) {
    $(k + "-count").textContent = fmt(st[k + "_count"]);
    $(k + "-cents").textContent = fmt(st[k + "_cents"]);
  }
  const body = $("sub-pools").tBodies[0];
  body.innerHTML = "";
  for (const sp of st.sub_pools) {
    const tr = body.insertRow();
    const w = sp.count > 0 ? (100 * sp.remaining_count) / sp.count : 0;
    tr.insertCell().textContent = sp.index;
    tr.insertCell().textContent = sp.shard;
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = w.toFixed(2) + "%";
    bar.append(fill);
    tr.insertCell().append(bar);
    tr.insertCell().textContent = fmt(sp.remaining_count) + " / " + fmt(sp.count);
    tr.insertCell().textContent = fmt(sp.remaining_cents) + " / " + fmt(sp.total_cents);
  }
}

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  $("token").value = "";
  open();
});

$("logout").addEventListener("click", () => {
  token = "";
  sessionStorage.removeItem(KEY);
  showLogin("");
});

$("audit").addEventListener("click", async () => {
  const out = $("audit-result");
  out.textContent = "auditing…";
  out.className = "muted";
  try {
    const rep = await api("/admin/pools/" + encodeURIComponent(selected) + "/audit");
    out.textContent = rep.ok ? "ok: conservation holds" + (rep.notes && rep.notes.length ? " (" + rep.notes.join("; ") + ")" : "")
      : "PROBLEMS: " + rep.problems.map((p) => JSON.stringify(p)).join("; ");
    out.className = rep.ok ? "" : "error";
    out.dataset.ok = String(rep.ok);
  } catch (e) {
    out.textContent = e.message;
    out.className = "error";
  }
});

if (token) open(); else showLogin("");
