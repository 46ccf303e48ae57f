// rain's dashboard: the service's charts, and the start of the page. It
// asks for the admin token once (kept for this tab: common.js), then polls
// the operator API once a second: the timeline (GET /admin/stats), the
// pools (pools.js) and the selected pool; the operator's forms and buttons
// are in preload.js and pools.js.
"use strict";

const COLORS = { granted: "#2e7d32", already_granted: "#7cb342", sold_out: "#6d4c41",
  overloaded: "#d23f31", not_found: "#8e24aa", not_started: "#f9a825", ended: "#546e7a",
  invalid: "#fb8c00", unauthorized: "#ad1457", rate_limited: "#00838f", error: "#000",
  p50: "#1565c0", p99: "#d23f31" };

let points = [];
let timer = 0;
let ticking = false; // a poll is in flight: the next one waits for it (a slow shard)

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

// refused is what every part of the page does when the API refuses the
// token: forget it and ask again, with the reason (never a blank page).
function refused() {
  token = "";
  sessionStorage.removeItem(KEY);
  showLogin("The admin token was refused: enter it again.");
}

// connect checks the token with one call, then shows the board and polls.
async function connect() {
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
  if (ticking) return;
  ticking = true;
  try {
    const since = points.length ? points[points.length - 1].at : "";
    const [stats] = await Promise.all([
      api("/admin/stats" + (since ? "?since=" + encodeURIComponent(since) : "")),
      refreshPools(),
    ]);
    points = points.concat(stats.points).slice(-300);
    drawService();
    $("error").hidden = true;
    $("live").textContent = "live · " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.unauthorized) {
      refused();
      return;
    }
    $("error").hidden = false;
    $("error").textContent = e.message;
  } finally {
    ticking = false;
  }
}

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

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  $("token").value = "";
  connect();
});

$("logout").addEventListener("click", () => {
  token = "";
  sessionStorage.removeItem(KEY);
  showLogin("");
});

if (token) connect(); else showLogin("");
