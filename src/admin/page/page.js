"use strict";
// The admin page: reads the admin endpoint's JSON routes every REFRESH_MS and shows
// what is stuck and why; the DLQ's rows can be browsed, replayed and purged from it.
// Every text from the server goes into the page as text (never as HTML).

const REFRESH_MS = 2000;
const TOKEN_KEY = "sluice-admin-token";
const SVG_NS = "http://www.w3.org/2000/svg";
/// The most rows one replay request takes (the endpoint's cap).
const REPLAY_LIMIT = 10000;
const PAGE_ROWS = 20;

const $ = (id) => document.getElementById(id);

// --- the token: from the URL fragment (#token=...) or the box, kept for this tab ---

(function takeTokenFromFragment() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
})();

function token() { return sessionStorage.getItem(TOKEN_KEY); }

$("auth").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  $("auth").hidden = true;
  refreshNow();
});

$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  askForToken("token forgotten");
});

function askForToken(why) {
  $("auth").hidden = false;
  $("auth-why").textContent = why + "; kept in this tab only, until it closes";
  $("forget").hidden = true;
}

class AuthError extends Error {}

/// A request to the admin endpoint with the token; the status and the JSON body.
async function call(method, path, body) {
  const headers = {};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401 || r.status === 403) {
    askForToken(r.status === 401 ? "the admin endpoint wants a token" : "that token is wrong");
    throw new AuthError("the admin endpoint wants a token");
  }
  $("forget").hidden = !t;
  let json = null;
  try { json = await r.json(); } catch (_) { json = null; }
  return { status: r.status, body: json };
}

async function get(path) { return call("GET", path); }

// --- small helpers ---

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined && c !== false) e.append(c);
  return e;
}

function pill(text, tone) { return el("span", { class: "pill " + tone }, text); }

/// "N rows/s": one decimal under 10, whole numbers with separators above.
function perSecond(rate) {
  if (rate === null || rate === undefined) return "— rows/s";
  const shown = rate < 10 ? (Math.round(rate * 10) / 10).toString() : Math.round(rate).toLocaleString("en-US");
  return shown + " rows/s";
}

function count(n) { return Number(n || 0).toLocaleString("en-US"); }

function rows(n) { return count(n) + (Number(n) === 1 ? " row" : " rows"); }

function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " m " + (s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " m";
}

function clock(date) { return date.toLocaleTimeString("en-GB"); }

function tableKey(tenant, table) { return tenant + "." + table; }

// --- the plot: a table's last ten minutes ---

const PLOT_W = 240, PLOT_H = 48;

function plot(series, windowS, periodS) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${PLOT_W} ${PLOT_H}`);
  svg.setAttribute("class", "plot");
  svg.setAttribute("role", "img");
  const lines = ["received", "inserted", "parked"];
  let max = 1;
  for (const name of lines) for (const v of series[name] || []) max = Math.max(max, v);
  const title = document.createElementNS(SVG_NS, "title");
  title.textContent = "last " + Math.round(windowS / 60) + " minutes; top of the plot: " + perSecond(max);
  svg.append(title);
  // The scale: what the top of the plot stands for.
  const top = document.createElementNS(SVG_NS, "text");
  top.setAttribute("x", 2);
  top.setAttribute("y", 8);
  top.setAttribute("class", "scale");
  top.textContent = perSecond(max);
  svg.append(top);
  const base = document.createElementNS(SVG_NS, "line");
  base.setAttribute("x1", 0); base.setAttribute("x2", PLOT_W);
  base.setAttribute("y1", PLOT_H - 0.5); base.setAttribute("y2", PLOT_H - 0.5);
  base.setAttribute("class", "axis");
  svg.append(base);
  const ago = series.ago_s || [];
  const x = (secondsAgo) => (PLOT_W * (1 - Math.min(secondsAgo, windowS) / windowS)).toFixed(1);
  for (const name of lines) {
    const values = series[name] || [];
    if (values.length === 0) continue;
    // A step per sample interval: flat across the interval it measured, so that even
    // the first interval of a new table shows.
    const points = values.flatMap((v, i) => {
      // Below the scale's text, above the axis.
      const y = (10 + (PLOT_H - 11) * (1 - v / max)).toFixed(1);
      return [x(ago[i] + periodS) + "," + y, x(ago[i]) + "," + y];
    });
    const line = document.createElementNS(SVG_NS, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("class", "line " + name);
    svg.append(line);
  }
  return svg;
}

// --- the tables ---

/// Every table node of the tree, by "tenant.table", with its target's name.
function tableNodes(tree) {
  const found = new Map();
  (function walk(n, target) {
    if (!n) return;
    if (n.kind === "table") found.set(n.name, { node: n, pool: target });
    for (const c of n.children || []) walk(c, n.kind === "target" ? n.name : target);
  })(tree, null);
  return found;
}

function consumerNode(tree) {
  return ((tree && tree.children) || []).find((c) => c.kind === "consumer");
}

function exactlyOnce(s) {
  if (!s || s.exactly_once === undefined) return el("span", { class: "facts" }, "not known yet");
  return el("div", {},
    s.exactly_once ? pill("exactly-once", "ok") : pill("at-least-once", "warn"),
    s.exactly_once_why ? el("div", { class: "facts why" }, s.exactly_once_why) : null);
}

function tableState(entry) {
  if (!entry) return el("span", { class: "facts" }, "idle (no actor)");
  const n = entry.node, s = n.state || {};
  const box = el("div", {});
  const tone = n.status === "running" ? "ok" : n.status === "failed" ? "bad" : "warn";
  box.append(pill(n.status, tone));
  if (s.backoff && s.backoff.state !== "closed") box.append(" ", gatePill(s.backoff, "backoff"));
  if (n.restarts) box.append(" ", pill(n.restarts + " restarts", "warn"));
  // A flight that stays in one step holds its rows: name the step (see flight_watch.rs).
  const slow = (s.flights_out || []).filter((f) => f.stage_ms >= 10000);
  for (const f of slow) {
    box.append(el("div", { class: "facts", "data-field": "slow-flight" },
      "a flight " + f.stage.replace("_", " ") + " for " + duration(f.stage_ms)));
  }
  if (s.missing_table) {
    const m = s.missing_table;
    box.append(el("div", { class: "error", "data-field": "missing" }, m.grace_left_ms > 0
      ? "the table does not exist: its rows wait, " + duration(m.grace_left_ms) + " of grace left"
      : "the table does not exist: its rows are parked as they come"));
  }
  const err = n.last_error || s.last_error || (s.backoff && s.backoff.last_error);
  if (err) box.append(el("div", { class: "error", "data-field": "error" }, "last error: " + err));
  return box;
}

function renderTables(tree, rates) {
  const nodes = tableNodes(tree);
  const byKey = new Map();
  for (const r of (rates && rates.tables) || []) byKey.set(tableKey(r.tenant, r.table), r);
  const keys = [...new Set([...byKey.keys(), ...nodes.keys()])].sort();
  if (keys.length === 0) {
    $("tables").replaceChildren(el("p", { class: "facts" }, "no table has had a row yet"));
    return;
  }
  const windowS = (rates && rates.window_s) || 600;
  const periodS = (rates && rates.period_s) || 5;
  const head = el("tr", {}, ...["Table", "Received", "Inserted", "Parked", "Last 10 min", "Buffered", "Delivery", "State"].map((h) => el("th", {}, h)));
  const lines = keys.map((key) => {
    const r = byKey.get(key), entry = nodes.get(key);
    const s = (entry && entry.node.state) || {};
    const recent = (r && r.last_minute) || null;
    return el("tr", { "data-table": key },
      el("td", { class: "name" }, key, entry && entry.pool ? el("div", { class: "facts" }, "target " + entry.pool) : null),
      el("td", { class: "rate", "data-field": "received" }, perSecond(recent && recent.received)),
      el("td", { class: "rate", "data-field": "inserted" }, perSecond(recent && recent.inserted)),
      el("td", { class: "rate", "data-field": "parked" }, perSecond(recent && recent.parked)),
      el("td", {}, r ? plot(r.series, windowS, periodS) : null),
      el("td", { class: "num", "data-field": "buffered" }, entry ? rows(s.buffered_rows) : "—"),
      el("td", { "data-field": "delivery" }, exactlyOnce(entry && s)),
      el("td", { "data-field": "state" }, tableState(entry)));
  });
  $("tables").replaceChildren(el("table", { class: "grid" }, el("thead", {}, head), el("tbody", {}, ...lines)));
}

function renderLag(tree) {
  const c = consumerNode(tree);
  const pending = c && c.state ? c.state.pending : undefined;
  $("lag").textContent = pending === undefined || pending === null
    ? "" : "consumer lag: " + count(pending) + " messages waiting in the stream";
}

// --- ClickHouse: each server's breaker ---

function gatePill(g, label) {
  const tone = g.state === "closed" ? "ok" : g.state === "probing" ? "warn" : "bad";
  return pill(label ? label + " " + g.state : g.state, tone);
}

function nextProbe(b) {
  if (b.state === "closed") return "none needed";
  if (b.probe_out) return "a probe is in flight now";
  if (b.window_remaining_ms === 0) return "due now (with the next flush)";
  if (b.window_until) {
    const at = new Date(b.window_until);
    return clock(at) + " (in " + duration(b.window_remaining_ms || 0) + ")";
  }
  return "—";
}

/// Every server's pool, under its target: one for a target of one server (named after
/// the target), one per replica of each shard for a cluster.
function poolNodes(tree) {
  return ((tree && tree.children) || []).filter((c) => c.kind === "target")
    .flatMap((t) => (t.children || []).filter((c) => c.kind === "pool"));
}

function renderPools(tree) {
  const pools = poolNodes(tree);
  if (pools.length === 0) {
    $("pools").replaceChildren(el("p", { class: "facts" }, "no target"));
    return;
  }
  $("pools").replaceChildren(...pools.map((p) => {
    const s = p.state || {}, b = s.breaker || { state: "closed" };
    const since = b.outage_for_ms !== undefined
      ? clock(new Date(Date.now() - b.outage_for_ms)) + " (for " + duration(b.outage_for_ms) + ")" : "—";
    const facts = el("dl", { class: "facts-list" },
      el("dt", {}, "breaker"), el("dd", { "data-field": "breaker" }, gatePill(b)),
      el("dt", {}, "outage since"), el("dd", { "data-field": "since" }, since),
      el("dt", {}, "next probe"), el("dd", { "data-field": "next-probe" }, nextProbe(b)),
      el("dt", {}, "server"), el("dd", {}, s.server_version ? "ClickHouse " + s.server_version : (s.probed_ok ? "answered" : "not probed yet")),
      el("dt", {}, "target"), el("dd", { "data-field": "target" }, (s.target || "—") + (s.replica && s.replica !== s.target ? ", shard " + s.shard : "")));
    const err = b.last_error || s.last_probe_error || p.last_error;
    return el("div", { class: "card", "data-pool": p.name },
      el("div", { class: "card-head" }, el("span", { class: "name" }, p.name), " ", pill(p.status, p.status === "running" ? "ok" : "warn")),
      facts,
      err ? el("div", { class: "error", "data-field": "last-error" }, "last error: " + err) : null);
  }));
}

// --- NATS: the one object /admin/nats answers, shown field by field ---

function label(key) { return key.replace(/_/g, " "); }

function value(v) {
  if (v === null || v === undefined) return el("span", { class: "facts" }, "—");
  if (Array.isArray(v)) {
    if (v.length === 0) return el("span", { class: "facts" }, "none");
    return el("ul", { class: "plain" }, ...v.map((item) => el("li", {}, value(item))));
  }
  if (typeof v === "object") return facts(v);
  if (typeof v === "boolean") return document.createTextNode(v ? "yes" : "no");
  if (typeof v === "number") return document.createTextNode(count(v));
  return document.createTextNode(String(v));
}

function facts(object) {
  const dl = el("dl", { class: "facts-list" });
  for (const [k, v] of Object.entries(object)) dl.append(el("dt", {}, label(k)), el("dd", { "data-field": k }, value(v)));
  return dl;
}

function renderNats(nats) {
  if (!nats) return;
  $("nats").replaceChildren(el("div", { class: "card" },
    el("div", { class: "card-head" }, pill(nats.connected ? "connected" : "not connected", nats.connected ? "ok" : "bad")),
    facts(nats)));
}

// --- the DLQ ---

let dlqCounts = new Map();

// The DLQ's rows stay the same elements from one refresh to the next (only their
// counts change), so a button is never swapped away under the pointer or the focus.
const dlqRows = new Map();

function renderDlq(dlq) {
  const tables = (dlq && dlq.tables) || [];
  dlqCounts = new Map(tables.map((t) => [tableKey(t.tenant, t.table), t.rows]));
  $("dlq-total").textContent = dlq ? rows(dlq.total) + " parked" : "";
  if (tables.length === 0) {
    dlqRows.clear();
    $("dlq").replaceChildren(el("p", { class: "facts" }, "empty: no row is parked"));
    return;
  }
  let body = $("dlq").querySelector("tbody");
  if (!body) {
    body = el("tbody", {});
    $("dlq").replaceChildren(el("table", { class: "grid" },
      el("thead", {}, el("tr", {}, el("th", {}, "Table"), el("th", {}, "Parked rows"), el("th", {}, ""))),
      body));
  }
  for (const [key, row] of dlqRows) {
    if (!dlqCounts.has(key)) { row.remove(); dlqRows.delete(key); }
  }
  tables.forEach((t, i) => {
    const key = tableKey(t.tenant, t.table);
    let row = dlqRows.get(key);
    if (!row) {
      row = dlqRow(t.tenant, t.table);
      dlqRows.set(key, row);
    }
    // In the answer's order; a row already in its place is left alone (moving it
    // would take the focus from its button).
    if (body.children[i] !== row) body.insertBefore(row, body.children[i] || null);
    row.querySelector("[data-field='parked']").textContent = count(t.rows);
    for (const b of row.querySelectorAll("button[data-action='replay'], button[data-action='purge']")) b.disabled = t.rows === 0;
  });
}

function dlqRow(tenant, table) {
  const action = (name, text, cls) => {
    const b = el("button", { type: "button", class: cls, "data-action": name }, text);
    b.addEventListener("click", () => dlqAction(name, tenant, table));
    return b;
  };
  const key = tableKey(tenant, table);
  return el("tr", { "data-dlq": key },
    el("td", { class: "name" }, key),
    el("td", { class: "num", "data-field": "parked" }),
    el("td", { class: "actions" }, action("show", "Show rows"), action("replay", "Replay", "primary"), action("purge", "Purge", "danger")));
}

function dlqAction(name, tenant, table) {
  if (name === "show") showParked(tenant, table, 0);
  else if (name === "replay") confirmReplay(tenant, table);
  else if (name === "purge") confirmPurge(tenant, table);
}

// The parked rows being browsed: which table, where the page starts.
let browsing = null;

async function showParked(tenant, table, after) {
  browsing = { tenant, table, after };
  const key = tableKey(tenant, table);
  $("parked").hidden = false;
  $("parked-title").textContent = "Parked rows of " + key + (after ? " (after #" + after + ")" : "");
  let page;
  try {
    page = await get(dlqPath(tenant, table) + `?limit=${PAGE_ROWS}&after=${after}`);
  } catch (e) {
    if (!(e instanceof AuthError)) $("parked-rows").replaceChildren(el("p", { class: "error" }, "cannot read the parked rows: " + e.message));
    return;
  }
  if (page.status !== 200) {
    $("parked-rows").replaceChildren(el("p", { class: "error" }, "cannot read the parked rows: " + ((page.body && page.body.error) || "answered " + page.status)));
    return;
  }
  const parked = page.body.rows || [];
  $("parked-rows").replaceChildren(parked.length === 0
    ? el("p", { class: "facts" }, "no parked row" + (after ? " after this one" : ""))
    : el("ol", { class: "parked" }, ...parked.map(parkedRow)));
  browsing.next = page.body.next_after;
  $("parked-next").disabled = page.body.next_after === null || page.body.next_after === undefined;
  $("parked-first").disabled = !after;
}

function parkedRow(r) {
  const h = r.headers || {};
  const at = h["Sluice-Parked-At"] ? new Date(h["Sluice-Parked-At"]) : null;
  const where = [
    "#" + r.sequence,
    at && !isNaN(at) ? "parked " + at.toLocaleString("en-GB") : null,
    h["Sluice-Error-Class"] ? h["Sluice-Error-Class"] + (h["Sluice-Error-Code"] ? " (code " + h["Sluice-Error-Code"] + ")" : "") : null,
    h["Sluice-Deliveries"] ? h["Sluice-Deliveries"] + (h["Sluice-Deliveries"] === "1" ? " delivery" : " deliveries") : null,
  ].filter(Boolean).join(" · ");
  // The row as parked, byte for byte (never parsed: JSON.parse would round its numbers).
  const text = r.row_base64 ? r.row + "\n(not UTF-8; its bytes in base64: " + r.row_base64 + ")" : r.row;
  return el("li", { "data-sequence": String(r.sequence) },
    el("div", { class: "facts" }, where),
    el("div", { class: "error", "data-field": "reason" }, h["Sluice-Error"] || "(no reason recorded)"),
    el("pre", { class: "row", "data-field": "row" }, text));
}

$("parked-next").addEventListener("click", () => { if (browsing && browsing.next) showParked(browsing.tenant, browsing.table, browsing.next); });
$("parked-first").addEventListener("click", () => { if (browsing) showParked(browsing.tenant, browsing.table, 0); });
$("parked-close").addEventListener("click", () => { browsing = null; $("parked").hidden = true; });

function notice(text, tone) {
  $("notice").hidden = false;
  $("notice").className = tone;
  $("notice").textContent = text;
}

// Replay: a confirmation, then the same request `sluice dlq replay` sends.
let pending = null;

function confirmReplay(tenant, table) {
  const key = tableKey(tenant, table), parked = dlqCounts.get(key) || 0;
  pending = { tenant, table };
  const some = parked > REPLAY_LIMIT ? "the first " + count(REPLAY_LIMIT) + " of the " + count(parked) : "the " + count(parked);
  $("replay-text").textContent = "Send " + some + " parked rows of " + key +
    " back to the ingest stream? Each is inserted again; a row that fails again is parked again with the new reason. Rows that are not JSON objects stay parked.";
  $("replay-confirm").textContent = "Replay " + rows(Math.min(parked, REPLAY_LIMIT));
  $("replay-dialog").showModal();
}

/// A confirmed DLQ action on the table `pending` names: closes its dialog, sends
/// `request(tenant, table, key)` (a method, a path and a body), says what the answer
/// `tell`s, and shows the new counts (and rows, when that table's are open).
function act(dialog, verb, request, tell) {
  return async () => {
    $(dialog).close();
    const what = pending;
    pending = null;
    if (!what) return;
    const key = tableKey(what.tenant, what.table);
    const [method, path, body] = request(what.tenant, what.table, key);
    let r;
    try {
      r = await call(method, path, body);
    } catch (e) {
      if (!(e instanceof AuthError)) notice(key + ": the " + verb + " failed: " + e.message, "bad");
      return;
    }
    if (r.status !== 200) notice(key + ": the " + verb + " failed: " + ((r.body && r.body.error) || "answered " + r.status), "bad");
    else notice(...tell(key, r.body));
    refreshNow();
    if (browsing && tableKey(browsing.tenant, browsing.table) === key) showParked(what.tenant, what.table, 0);
  };
}

function dlqPath(tenant, table) {
  return `/admin/dlq/${encodeURIComponent(tenant)}/${encodeURIComponent(table)}`;
}

$("replay-cancel").addEventListener("click", () => { pending = null; $("replay-dialog").close(); });
$("replay-confirm").addEventListener("click", act("replay-dialog", "replay",
  (tenant, table) => ["POST", "/admin/dlq/replay", { tenant, table, limit: REPLAY_LIMIT }],
  (key, b) => {
    const errors = (b.errors || []).length ? ": " + b.errors.join("; ") : "";
    return [key + ": " + rows(b.replayed) + " replayed, " + count(b.skipped) + " skipped (not JSON objects), " +
      count(b.failed) + " failed" + errors, b.failed ? "bad" : "ok"];
  }));

// Purge: the table's name typed, then the same request `sluice dlq purge` sends.
function confirmPurge(tenant, table) {
  const key = tableKey(tenant, table);
  pending = { tenant, table };
  $("purge-text").textContent = "Purging deletes the " + count(dlqCounts.get(key) || 0) + " parked rows of " + key + " for good: it cannot be undone.";
  $("purge-name").textContent = key;
  $("purge-input").value = "";
  $("purge-confirm").disabled = true;
  $("purge-dialog").showModal();
}

$("purge-input").addEventListener("input", () => {
  $("purge-confirm").disabled = !pending || $("purge-input").value !== tableKey(pending.tenant, pending.table);
});
$("purge-cancel").addEventListener("click", () => { pending = null; $("purge-dialog").close(); });
$("purge-confirm").addEventListener("click", act("purge-dialog", "purge",
  (tenant, table, key) => ["DELETE", dlqPath(tenant, table) + "?confirm=" + encodeURIComponent(key)],
  (key, b) => [key + ": " + rows(b.purged) + " purged", "ok"]));

// --- the actor tree (for restarts and staleness) ---

function treeNode(n) {
  const tone = n.status === "running" ? "ok" : n.status === "failed" ? "bad" : "warn";
  const box = el("div", { class: "node", "data-kind": n.kind, "data-name": n.name, "data-status": n.status },
    el("div", { class: "head" },
      el("span", { class: "kind" }, n.kind), el("span", { class: "name" }, n.name), pill(n.status, tone),
      n.restarts ? pill(n.restarts + " restarts", "warn") : null,
      n.stale ? pill("stale " + duration(n.snapshot_age_ms), "warn") : null));
  if (n.last_error) box.append(el("div", { class: "error" }, n.last_error));
  for (const c of n.children || []) box.append(treeNode(c));
  return box;
}

// --- the refresh loop ---

let timer = null;

function refreshNow() {
  clearTimeout(timer);
  refresh();
}

async function refresh() {
  let answers;
  try {
    answers = await Promise.all([
      get("/admin/actors"), get("/admin/rates"), get("/readyz"), get("/admin/dlq"), get("/admin/nats")]);
  } catch (e) {
    if (e instanceof AuthError) {
      // Asking again without a new token would only be refused again: wait for one.
      $("status").textContent = "waiting for the admin token";
      return;
    }
    $("status").textContent = "cannot refresh: " + e.message;
    timer = setTimeout(refresh, REFRESH_MS);
    return;
  }
  timer = setTimeout(refresh, REFRESH_MS);
  // Outside the try: a fault of the page itself must reach the console, not hide in
  // the status line.
  render(...answers);
}

function render(tree, rates, ready, dlq, nats) {
  const treeBody = tree.status === 200 ? tree.body : null;
  renderTables(treeBody, rates.status === 200 ? rates.body : null);
  renderLag(treeBody);
  renderPools(treeBody);
  renderNats(nats.status === 200 ? nats.body : null);
  renderDlq(dlq.status === 200 ? dlq.body : null);
  if (treeBody) $("tree").replaceChildren(treeNode(treeBody));
  const isReady = ready.status === 200;
  $("ready").textContent = isReady ? "ready" : "not ready";
  $("ready").className = "pill " + (isReady ? "ok" : "bad");
  $("reasons").textContent = isReady ? "" : ((ready.body && ready.body.reasons) || []).join("\n");
  const failed = [["actors", tree], ["rates", rates], ["DLQ", dlq], ["NATS", nats]].filter(([, r]) => r.status !== 200);
  $("status").textContent = "updated " + clock(new Date()) +
    (failed.length ? "; not answered: " + failed.map(([name, r]) => name + " (" + ((r.body && r.body.error) || r.status) + ")").join(", ") : "");
}

refresh();
