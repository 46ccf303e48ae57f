// The pools: the list with each pool's state (filterable), the selected
// pool's numbers, its actions (end, close, audit, finish loading), and a
// closed pool's account, shown and downloadable as CSV.
//
// Every pool's status is GET /admin/pools/{id}; a closed pool's status is
// its final account, which never changes, so it is read once. The selected
// pool is read every second, the others every five: a console left open
// during a rain adds little to what the shards serve.
"use strict";

const pools = new Map(); // pool id -> {st: its status or account, error: the last read's, at: when read (ms)}
let selected = "";
const OTHERS_EVERY_MS = 5000;

const isOver = (st) => st && (st.state === "closed" || st.state === "closing");

// refreshPools reads the list and the statuses that are due, and draws.
async function refreshPools() {
  const ids = (await api("/admin/pools")).pools;
  for (const id of [...pools.keys()]) if (!ids.includes(id)) pools.delete(id);
  const now = Date.now();
  await Promise.all(ids.map((id) => {
    const p = pools.get(id);
    if (p && p.st && p.st.state === "closed") return null;
    if (p && id !== selected && now - p.at < OTHERS_EVERY_MS) return null;
    return readPool(id);
  }));
  drawList(ids);
  drawPool();
}

// readPool reads one pool's status; an error other than a refused token
// is kept beside the last status read, to be shown.
async function readPool(id) {
  let p = pools.get(id);
  if (!p) pools.set(id, (p = { st: null, error: "", at: 0 }));
  try {
    p.st = await api(poolPath(id));
    p.error = "";
  } catch (e) {
    if (e.unauthorized) throw e;
    if (e.code === 404 && !p.st) {
      pools.delete(id); // not there (yet): a pool being registered, or a preload refused
      return null;
    }
    p.error = e.message;
  }
  p.at = Date.now();
  return p;
}

// stateOf is what the list says of a pool: its state, or why it is not known.
function stateOf(p) {
  if (p.st) return p.st.state;
  return p.error ? "unreadable" : "…";
}

function drawList(ids) {
  ids = ids || [...pools.keys()].sort();
  const body = $("pool-table").tBodies[0];
  const rows = new Map([...body.rows].map((tr) => [tr.dataset.pool, tr]));
  for (const [id, tr] of rows) if (!pools.has(id)) tr.remove();
  for (const id of ids) {
    if (!pools.has(id)) continue;
    let tr = rows.get(id);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.pool = id;
      const b = document.createElement("button");
      b.className = "link";
      b.textContent = id;
      b.addEventListener("click", () => select(id));
      tr.insertCell().append(b);
      for (let i = 0; i < 3; i++) tr.insertCell();
    }
    body.append(tr); // in the list's order
    const p = pools.get(id), st = p.st, state = stateOf(p);
    tr.dataset.state = state;
    tr.classList.toggle("selected", id === selected);
    const badge = document.createElement("span");
    badge.className = "state state-" + state;
    badge.textContent = state;
    badge.title = p.error;
    tr.cells[1].replaceChildren(badge);
    if (!st) {
      tr.cells[2].textContent = tr.cells[3].textContent = "";
    } else if (isOver(st)) {
      tr.cells[2].textContent = fmt(st.confirmed_count) + " confirmed · " + fmt(st.unclaimed_count) + " unclaimed";
      tr.cells[3].textContent = yuan(st.confirmed_cents) + " paid · " + yuan(st.unclaimed_cents) + " back";
    } else {
      tr.cells[2].textContent = fmt(st.remaining_count) + " of " + fmt(st.count) + (st.state === "loading" ? " loaded" : " left");
      tr.cells[3].textContent = yuan(st.remaining_cents) + " of " + yuan(st.total_cents);
    }
  }
  filterList();
}

// filterList shows the pools whose id contains the filter's text and
// whose state is the one chosen (all when none is).
function filterList() {
  const text = $("pool-filter").value.trim().toLowerCase(), state = $("state-filter").value;
  const rows = [...$("pool-table").tBodies[0].rows];
  let shown = 0;
  for (const tr of rows) {
    tr.hidden = !(tr.dataset.pool.toLowerCase().includes(text) && (!state || tr.dataset.state === state));
    if (!tr.hidden) shown++;
  }
  $("pools-empty").hidden = rows.length > 0;
  $("pool-table").hidden = rows.length === 0;
  $("pools-shown").textContent = rows.length ? shown + " of " + rows.length + " shown" : "";
}

async function select(id) {
  selected = id;
  $("action-result").replaceChildren();
  $("audit-result").textContent = "";
  drawList();
  try {
    await readPool(id);
  } catch (e) {
    if (e.unauthorized) return refused();
  }
  drawList();
  drawPool();
}

function drawPool() {
  const p = pools.get(selected);
  $("pool").hidden = !p;
  if (!p) return;
  const st = p.st;
  $("pool").dataset.pool = selected;
  $("pool-id").textContent = selected;
  $("pool-state").textContent = stateOf(p);
  $("pool-state").className = "state state-" + stateOf(p);
  $("pool-error").hidden = !p.error;
  $("pool-error").textContent = p.error ? "Cannot read the pool now: " + p.error : "";
  if (st) {
    $("account-view").hidden = !isOver(st);
    $("live-view").hidden = isOver(st);
    if (isOver(st)) drawAccount(st); else drawLive(st);
  }
  drawActions(st);
}

function drawLive(st) {
  const loading = st.state === "loading";
  const pct = st.count > 0 ? (100 * st.remaining_count) / st.count : 0;
  $("pool-bar").style.width = pct.toFixed(2) + "%";
  $("pool-bar").dataset.remaining = String(st.remaining_count);
  $("pool-bar").classList.toggle("loading", loading);
  $("pool-remaining").textContent = loading
    ? "Loading: " + fmt(st.remaining_count) + " of " + fmt(st.count) + " packets loaded (" + pct.toFixed(0) + "%) · " + yuan(st.remaining_cents) + " of " + yuan(st.total_cents)
    : fmt(st.remaining_count) + " of " + fmt(st.count) + " packets left · " + money(st.remaining_cents) + " of " + money(st.total_cents);
  const spec = st.spec || {};
  $("pool-window").textContent = (spec.starts_at ? "opens " + localOf(spec.starts_at) : "open from its preload") + " · " +
    (spec.ends_at ? "ends " + localOf(spec.ends_at) : "no end set") +
    (spec.hold_seconds ? " · a grant waits up to " + fmt(spec.hold_seconds) + " s for settlement" : "");
  for (const k of ["remaining", "held", "confirmed", "released"]) {
    $(k + "-count").textContent = fmt(st[k + "_count"]);
    $(k + "-cents").textContent = fmt(st[k + "_cents"]);
  }
  const body = $("sub-pools").tBodies[0];
  body.replaceChildren();
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

// drawAccount shows a closed pool's final account: what was preloaded,
// what users got (confirmed), what goes back to the campaign (unclaimed),
// per sub-pool. A sub-pool's own preload is not in the account: one that
// lent stock to a sibling confirms less than it was loaded with.
function drawAccount(a) {
  for (const k of ["preloaded", "confirmed", "unclaimed"]) {
    $("a-" + k + "-count").textContent = fmt(a[k + "_count"]);
    $("a-" + k + "-cents").textContent = fmt(a[k + "_cents"]);
    $("a-" + k + "-yuan").textContent = yuan(a[k + "_cents"]);
  }
  $("account-closed").textContent = a.state === "closing" ? "(closing: its keys are being freed; Close finishes it)"
    : a.closed_at ? "closed " + localOf(a.closed_at) : "";
  const body = $("account-subs").tBodies[0];
  body.replaceChildren();
  for (const sp of a.sub_pools) {
    const tr = body.insertRow();
    for (const v of [sp.index, fmt(sp.confirmed_count), fmt(sp.confirmed_cents), fmt(sp.unclaimed_count), fmt(sp.unclaimed_cents)]) {
      tr.insertCell().textContent = v;
    }
  }
}

// drawActions offers what the pool's state allows (the API decides in the
// end, and its refusals are shown).
function drawActions(st) {
  const state = st ? st.state : "";
  const busy = loadingHere.has(selected);
  $("resume").hidden = state !== "loading";
  $("resume").disabled = busy;
  $("end").hidden = $("close").hidden = state === "closed";
  $("end").disabled = state !== "open";
  $("close").disabled = state !== "ended" && state !== "closing";
  $("action-hint").textContent = {
    loading: busy ? "Loading…" : "Still loading, or stopped midway: Finish loading sends its preload again, which continues where the loading is (safe beside another preload of it).",
    open: "Close comes after the end: end the pool first.",
    ended: "Ended: close it once settlement has confirmed every grant.",
    closed: "Closed: the account is final.",
  }[state] || "";
}

// confirmAction asks in a modal dialog; true when the operator confirms.
function confirmAction(title, text, ok) {
  const d = $("confirm");
  if (d.open) return Promise.resolve(false); // a second click while it asks
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = ok;
  d.returnValue = "";
  d.showModal();
  return new Promise((resolve) => d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true }));
}

// inWords says a close's (or an end's) refusal reason, as the API gives
// it (docs/api.md), in words an operator acts on.
const WORDS = [
  [/^sub-pool (\d+): window open$/, (m) => `Sub-pool ${m[1]} is still open for grabs: end the pool first.`],
  [/^sub-pool (\d+): (\d+) grants held$/, (m) => `Sub-pool ${m[1]} still holds ${fmt(m[2])} grant(s) that settlement has not confirmed and whose hold has not run out: close again once they are settled.`],
  [/^sub-pool (\d+): (\d+) spills in flight$/, (m) => `Sub-pool ${m[1]} has ${fmt(m[2])} packet(s) in flight between sub-pools: the reaper finishes them shortly; close again then.`],
  [/^sub-pool (\d+): (\d+) entries unsettled$/, (m) => `Settlement has not yet acknowledged ${fmt(m[2])} grant(s) of sub-pool ${m[1]}: is settlement running? Close again once it has caught up.`],
  [/^audit: (.*)$/s, (m) => `The audit found a difference, so nothing was closed: ${m[1]}.`],
  [/^books: (.*)$/s, (m) => `The database does not match the pool: ${m[1]}.`],
  [/still loading/, () => "The pool is still loading: finish its preload first."],
];

function inWords(reason) {
  for (const [re, say] of WORDS) {
    const m = re.exec(reason);
    if (m) return say(m);
  }
  return reason;
}

// showRefusal lists the reasons of a refused action (each of "a; b; c"
// after "cannot close:"), in words, each keeping the API's own words.
function showRefusal(what, e) {
  const out = $("action-result");
  const head = document.createElement("p");
  head.className = "error";
  const list = document.createElement("ul");
  list.id = "refusal";
  if (e.code === 409) {
    head.textContent = what + " was refused; nothing changed:";
    const m = /cannot close: (.*)$/s.exec(e.message);
    for (const reason of m ? m[1].split("; ") : [e.message]) {
      const li = document.createElement("li");
      li.textContent = inWords(reason);
      li.dataset.reason = reason;
      li.title = reason;
      list.append(li);
    }
  } else {
    head.textContent = what + " failed: " + e.message + (e.code === 503 ? " (a shard did not answer: try again)" : "");
  }
  out.replaceChildren(head, list);
  out.dataset.code = String(e.code);
}

function showDone(text) {
  const p = document.createElement("p");
  p.className = "ok";
  p.textContent = text;
  $("action-result").replaceChildren(p);
  $("action-result").dataset.code = "200";
}

$("end").addEventListener("click", async () => {
  const id = selected, st = pools.get(id).st;
  const hold = st.spec && st.spec.hold_seconds;
  const ok = await confirmAction("End pool " + id + " now?",
    `From now on every grab of ${id} is answered "ended": nobody gets another packet. The ${fmt(st.held_count)} grant(s) held now stay held until settlement confirms them or their hold` +
    (hold ? ` (${fmt(hold)} s)` : "") + ` runs out. The ${fmt(st.remaining_count)} packet(s) left (${yuan(st.remaining_cents)}) are not given out; they go back to the campaign when the pool is closed. An ended pool cannot be opened again.`,
    "End " + id);
  if (!ok) return;
  try {
    pools.get(id).st = (await call("POST", poolPath(id) + "/end")).body;
    showDone(`${id} has ended: grabs are answered "ended". Close it once settlement has confirmed every grant.`);
  } catch (e) {
    if (e.unauthorized) return refused();
    showRefusal("Ending " + id, e);
  }
  drawList();
  drawPool();
});

$("close").addEventListener("click", async () => {
  const id = selected, st = pools.get(id).st;
  const ok = await confirmAction("Close pool " + id + "?",
    `rain checks that ${id} has ended, that no grant is held, that settlement has acknowledged every grant and that the audit is whole. ` +
    `Then it records the final account (${isOver(st) ? "already recorded" : fmt(st.confirmed_count) + " grant(s) confirmed so far, " + yuan(st.confirmed_cents) + "; what is left goes back to the campaign"}) ` +
    `and frees the pool's keys on the shards. A closed pool cannot be opened again, and its id cannot be preloaded again. If a check fails, nothing changes and this page says why.`,
    "Close " + id);
  if (!ok) return;
  try {
    pools.get(id).st = (await call("POST", poolPath(id) + "/close")).body;
    showDone(`${id} is closed: its account is recorded.`);
  } catch (e) {
    if (e.unauthorized) return refused();
    showRefusal("Closing " + id, e);
  }
  drawList();
  drawPool();
});

$("audit").addEventListener("click", async () => {
  const out = $("audit-result");
  out.textContent = "auditing…";
  out.className = "muted";
  delete out.dataset.ok;
  try {
    const rep = await api(poolPath(selected) + "/audit");
    out.textContent = rep.ok ? "ok: conservation holds" + (rep.notes && rep.notes.length ? " (" + rep.notes.join("; ") + ")" : "")
      : "PROBLEMS: " + rep.problems.map((p) => JSON.stringify(p)).join("; ");
    out.className = rep.ok ? "" : "error";
    out.dataset.ok = String(rep.ok);
  } catch (e) {
    if (e.unauthorized) return refused();
    out.textContent = e.message;
    out.className = "error";
  }
});

// accountCSV is a closed pool's account as CSV: a row for the pool, then
// one per sub-pool (whose preload the account does not keep: blank). Ids
// and numbers need no quoting (ids are [A-Za-z0-9_.:-]).
function accountCSV(a) {
  const rows = [["pool_id", "sub_pool", "preloaded_count", "preloaded_cents", "confirmed_count", "confirmed_cents", "unclaimed_count", "unclaimed_cents", "closed_at"],
    [a.pool_id, "all", a.preloaded_count, a.preloaded_cents, a.confirmed_count, a.confirmed_cents, a.unclaimed_count, a.unclaimed_cents, a.closed_at]];
  for (const sp of a.sub_pools) {
    rows.push([a.pool_id, sp.index, "", "", sp.confirmed_count, sp.confirmed_cents, sp.unclaimed_count, sp.unclaimed_cents, a.closed_at]);
  }
  return rows.map((r) => r.join(",")).join("\r\n") + "\r\n";
}

$("csv").addEventListener("click", () => {
  const a = pools.get(selected).st;
  const url = URL.createObjectURL(new Blob([accountCSV(a)], { type: "text/csv" }));
  const link = document.createElement("a");
  link.href = url;
  link.download = a.pool_id + "-account.csv";
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
});

$("pool-filter").addEventListener("input", filterList);
$("state-filter").addEventListener("change", filterList);
