// What every part of the page shares: the admin token, the one function
// that calls the operator API with it, and the formats of counts and money.
//
// The token lives in this page's memory and the tab's sessionStorage only
// (no cookie: a request from another site carries nothing, so there is no
// cross-site request to forge); it travels in the Authorization header,
// never in a URL. Every action of the page is one call of the operator API
// (docs/api.md): the page can do nothing the API would not let the token
// do, and the API checks every call, whatever the page shows.
"use strict";

const KEY = "rain.adminToken";
const $ = (id) => document.getElementById(id);

let token = sessionStorage.getItem(KEY) || "";

// ApiError is an answer other than 2xx: its status code and the server's
// "error" (its reason, as docs/api.md says).
class ApiError extends Error {
  constructor(code, message, body) {
    super(message);
    this.code = code;
    this.body = body;
    this.unauthorized = code === 401;
  }
}

// call sends one request to the operator API with the token: method, path
// and, for a POST, a body (an object, sent as JSON). It returns
// {code, body} for a 2xx answer and throws an ApiError for any other (a
// network failure is code 0).
async function call(method, path, body) {
  const init = { method, headers: { Authorization: "Bearer " + token }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "rain does not answer (" + e.message + ")", null);
  }
  let data = null;
  try {
    data = await r.json();
  } catch (e) {
    data = null; // an answer that is not JSON: a proxy's page, say
  }
  if (r.status === 401) {
    throw new ApiError(401, "wrong admin token", data);
  }
  if (!r.ok) {
    throw new ApiError(r.status, (data && data.error) || method + " " + path + " answered " + r.status, data);
  }
  return { code: r.status, body: data };
}

// api is a GET of path: the answer's body.
async function api(path) {
  return (await call("GET", path)).body;
}

const poolPath = (id) => "/admin/pools/" + encodeURIComponent(id);

const fmt = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
const money = (cents) => (cents / 100).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
const yuan = (cents) => (cents === null || cents === undefined ? "—" : "¥" + money(cents));

// centsOf reads an amount in yuan with at most two decimals ("5000",
// "5,000.5", "0.01") as integer cents, exactly (no floating point). It
// returns null for a blank field and throws an Error saying what is wrong
// with anything else.
function centsOf(text) {
  const s = text.trim().replace(/,/g, "");
  if (s === "") return null;
  const m = /^(\d{1,13})(?:\.(\d{0,2}))?$/.exec(s);
  if (!m) {
    throw new Error(/^\d+\.\d{3,}$/.test(s) ? "at most two decimals (cents)" :
      /^\d{14,}/.test(s) ? "too large" : "an amount in yuan, such as 5000.00");
  }
  return Number(m[1]) * 100 + Number((m[2] || "").padEnd(2, "0"));
}

// wholeOf reads a whole number; null for a blank field.
function wholeOf(text) {
  const s = text.trim().replace(/,/g, "");
  if (s === "") return null;
  if (!/^\d{1,15}$/.test(s)) throw new Error("a whole number");
  return Number(s);
}

// utcOf is a datetime-local field's value (the browser's local time) as
// RFC 3339 in UTC, to the second; null for a blank field.
function utcOf(value) {
  if (!value) return null;
  const d = new Date(value);
  if (isNaN(d)) throw new Error("a date and time");
  return d.toISOString().replace(/\.\d{3}Z$/, "Z");
}

// localOf shows an RFC 3339 time in the browser's local time, with its UTC.
function localOf(rfc3339) {
  const d = new Date(rfc3339);
  return d.toLocaleString("en-GB", { dateStyle: "medium", timeStyle: "medium" }) + " (" + rfc3339 + ")";
}
