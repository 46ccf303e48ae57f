// The preload form: an operator's pool in yuan and local time, sent as
// POST /admin/pools in integer cents and UTC; a preview of the split before
// it is sent; the server's 400 reason beside the field it names; and the
// pool's loading progress (its record's state, read from
// GET /admin/pools/{id}) until it opens.
//
// The page checks only what it must to build the request (an amount it
// cannot turn into cents, a number that is not one); whether the spec can
// be met is the server's to say, and its reason is shown as it gave it.
"use strict";

const loadingHere = new Set(); // pools this page is preloading now
let showWhenLoaded = ""; // the pool just sent: selected once it exists
const LOADING_POLL_MS = 300;

// FIELDS are the request's fields, each with its input and how it is read.
const FIELDS = [
  ["pool_id", "f-pool", (v) => v.trim()],
  ["total_cents", "f-total", centsOf],
  ["count", "f-count", wholeOf],
  ["min_cents", "f-min", centsOf],
  ["max_cents", "f-max", centsOf],
  ["sub_pools", "f-subs", wholeOf],
  ["starts_at", "f-starts", utcOf],
  ["ends_at", "f-ends", utcOf],
  ["hold_seconds", "f-hold", wholeOf],
];

function clearFieldErrors() {
  for (const [name, input] of FIELDS) {
    $("e-" + name).textContent = "";
    $(input).removeAttribute("aria-invalid");
  }
}

function fieldError(name, message) {
  const input = FIELDS.find((f) => f[0] === name)[1];
  $("e-" + name).textContent = message;
  $(input).setAttribute("aria-invalid", "true");
}

// readForm returns the request's body (blank optional fields left out,
// as the API's defaults then apply) and the errors of fields it could not
// read, by field.
function readForm() {
  const body = {}, errors = {};
  for (const [name, input, read] of FIELDS) {
    try {
      const v = read($(input).value);
      if (v !== null && v !== "") body[name] = v;
    } catch (e) {
      errors[name] = e.message;
    }
  }
  if (body.pool_id === undefined) body.pool_id = ""; // the server names what an id must be
  for (const name of ["total_cents", "count"]) {
    if (body[name] === undefined && !errors[name]) errors[name] = "required";
  }
  return { body, errors };
}

// preview says what the split will be like before it is sent: the
// average, and the least and most one packet can get (double-mean split:
// a draw is at most about twice the average of what is left; the last
// packet takes the rest).
function preview() {
  const { body: b, errors } = readForm();
  $("u-starts").textContent = b.starts_at ? "sent as " + b.starts_at : "at once";
  $("u-ends").textContent = b.ends_at ? "sent as " + b.ends_at : "no end";
  const out = $("preview");
  out.className = "preview";
  for (const k of Object.keys(out.dataset)) delete out.dataset[k];
  if (errors.total_cents || errors.count || !b.total_cents || !b.count) {
    out.textContent = "Enter the total and the number of packets to see the split.";
    return;
  }
  const n = b.count, total = b.total_cents, min = b.min_cents || 1, max = b.max_cents || 0;
  if (min * n > total || (max > 0 && max * n < total) || (max > 0 && max < min)) {
    out.className = "preview warn";
    out.textContent = `${fmt(n)} packets of at least ${yuan(min)}` + (max ? ` and at most ${yuan(max)}` : "") +
      ` cannot make ${yuan(total)}: the server will refuse this spec.`;
    out.dataset.possible = "false";
    return;
  }
  const highest = Math.min(max || Infinity, total - (n - 1) * min);
  const typical = Math.min(highest, Math.max(min, Math.floor((2 * total) / n)));
  out.dataset.possible = "true";
  out.dataset.avgCents = String(total / n);
  out.dataset.minCents = String(min);
  out.dataset.maxCents = String(highest);
  out.textContent = `${fmt(n)} packets, ${yuan(total)} in all: ${total % n ? "about " : ""}${yuan(Math.round(total / n))} on average` +
    `; each between ${yuan(min)} and ${yuan(highest)}, most below about ${yuan(typical)}` +
    `; ${b.sub_pools ? fmt(b.sub_pools) + " sub-pool(s)" : "sub-pools chosen by rain"}` +
    `; grants wait up to ${fmt(b.hold_seconds || 600)} s for settlement.`;
}

// fieldOf is the field a server's reason names first ("total_cents 5 is
// less than count 10 × min_cents 1" is about the total); a window's
// length is about its end.
function fieldOf(reason) {
  if (/\bwindow\b/.test(reason)) return "ends_at";
  const m = /\b(pool_id|total_cents|count|min_cents|max_cents|sub_pools|starts_at|ends_at|hold_seconds)\b/.exec(reason);
  return m ? m[1] : "";
}

function result(text, cls) {
  $("preload-result").textContent = text;
  $("preload-result").className = cls || "";
}

// preload sends the body, watches the pool load while the request runs,
// and says how it ended. The same body again finishes a preload that
// stopped midway (preload is idempotent on the pool id).
async function preload(body) {
  const id = body.pool_id;
  loadingHere.add(id);
  $("preload-submit").disabled = true;
  result("Preloading " + id + "…", "muted");
  const watch = setInterval(() => watchLoading(id), LOADING_POLL_MS);
  try {
    const r = await call("POST", "/admin/pools", body);
    pools.set(id, { st: r.body, error: "", at: Date.now() });
    result(r.code === 201 ? `${id} is open: ${fmt(r.body.count)} packets, ${yuan(r.body.total_cents)}.`
      : `${id} was loaded already with this spec (${r.body.state}).`, "ok");
  } catch (e) {
    if (e.unauthorized) return refused();
    if (e.code === 400 || e.code === 409) {
      const name = e.code === 409 ? "pool_id" : fieldOf(e.message);
      if (name) fieldError(name, e.message);
      result((e.code === 409 ? "Refused (the id is taken): " : "Refused: ") + e.message, "error");
      $("preload-result").dataset.code = String(e.code);
      return;
    }
    result(e.code === 0
      ? `No answer to the preload of ${id} (${e.message}): it may still be loading, as its state below shows. If it stops moving, Finish loading sends it again and it continues where it stopped.`
      : `The preload of ${id} stopped: ${e.message}. What was loaded is kept; Finish loading sends it again and it continues where it stopped.`, "error");
  } finally {
    clearInterval(watch);
    loadingHere.delete(id);
    $("preload-submit").disabled = false;
  }
  await refreshAfter(id);
}

// watchLoading reads the pool being loaded, for its progress; a read that
// fails (the record not written yet, a shard) waits for the next.
async function watchLoading(id) {
  if (!loadingHere.has(id)) return;
  try {
    await readPool(id);
  } catch (e) {
    return;
  }
  if (!loadingHere.has(id)) return; // the preload answered meanwhile: its answer is newer
  shown(id);
}

async function refreshAfter(id) {
  try {
    await readPool(id);
  } catch (e) {
    if (e.unauthorized) return refused();
  }
  shown(id);
}

// shown draws the pool being loaded, selecting it the first time it exists.
function shown(id) {
  if (showWhenLoaded === id && pools.has(id)) {
    showWhenLoaded = "";
    select(id);
    return;
  }
  drawList();
  if (selected === id) drawPool();
}

$("preload-form").addEventListener("input", preview);
$("preload-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  clearFieldErrors();
  delete $("preload-result").dataset.code;
  const { body, errors } = readForm();
  const bad = Object.keys(errors);
  if (bad.length) {
    for (const name of bad) fieldError(name, errors[name]);
    result("Check the fields marked.", "error");
    return;
  }
  showWhenLoaded = body.pool_id;
  await preload(body);
});

// Finish loading: the pool's own spec, as the server stored it, sent
// again.
$("resume").addEventListener("click", () => {
  const st = pools.get(selected).st;
  if (st && st.spec) preload(st.spec);
});

preview();
