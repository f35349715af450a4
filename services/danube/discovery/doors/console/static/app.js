// The Danube admin console (docs/console.md). Plain JavaScript, no build step, no library:
// every action is a call to the public JSON API (/v1/...), with the operator's bearer token
// when one is set, so the page can do only what the CLI can. Names and payloads from the API
// are put in the page as text nodes (never as HTML). What the principal may do is asked of the
// server (GET /v1/security/whoami); the page only hides what it was told is not allowed.
"use strict";

const TOKEN_KEY = "danube.console.token";
const STATS_INTERVAL_MS = 2000;   // topic page: counters for the live charts
const REFRESH_INTERVAL_MS = 5000; // tables: cluster, topic description, topic list
const CHART_POINTS_MAX = 90;      // 3 minutes of 2 s samples
const TOPIC_ROWS_MAX = 100;       // topics whose counters the list asks for at once
const REQUEST_TIMEOUT_MS = 15000;
// Danube's permission names, for the role form (the server validates every PUT).
const PERMISSIONS = ["Lookup", "Produce", "Consume", "ManageNamespace", "ManageTopic",
                     "ManageSchema", "ManageBroker", "ManageCluster"];

// --- the API ------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
  let response;
  try {
    response = await fetch(path, {
      method, headers, signal: controller.signal,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (exc) {
    throw new ApiError(0, "unreachable", `${method} ${path}: ${exc.message || exc}`);
  } finally {
    clearTimeout(timer);
  }
  if (response.status === 204) return null;
  let doc = null;
  try { doc = await response.json(); } catch (_) { doc = null; }
  if (!response.ok) {
    const err = (doc && doc.error) || {};
    throw new ApiError(response.status, err.code || "http_" + response.status,
                       err.message || response.statusText);
  }
  return doc;
}

const enc = encodeURIComponent;
const topicPath = (ns, topic) => `/v1/topics/${enc(ns)}/${enc(topic)}`;

// --- small DOM helpers ----------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function s(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

function fmt(n) {
  if (n === null || n === undefined) return "–";
  if (typeof n !== "number") return String(n);
  if (Math.abs(n) >= 100 || Number.isInteger(n)) return Math.round(n).toLocaleString("en-US");
  return n.toFixed(2);
}
function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? Math.round(n) : n.toFixed(1)) + " " + units[i];
}
function fmtTime(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "–"; }

function showError(exc) {
  const box = document.getElementById("error");
  if (!exc) { box.hidden = true; box.textContent = ""; return; }
  if (exc.status === 401) { askToken(exc); return; } // no or a refused token: ask for one
  const status = exc.status ? `${exc.status} ${exc.code}: ` : "";
  box.textContent = status + exc.message;
  box.hidden = false;
}
function notice(text) {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.hidden = !text;
}

// Runs an action from a button: clears old messages, shows the API's error if it fails.
async function act(fn, doneText) {
  showError(null);
  notice("");
  try {
    const result = await fn();
    if (doneText) notice(typeof doneText === "function" ? doneText(result) : doneText);
    return result;
  } catch (exc) {
    showError(exc);
    return undefined;
  }
}

function table(headers, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((x) => (x instanceof Node ? x : h("th", {}, x))))),
    h("tbody", {}, rows));
}

// --- pages and their timers ------------------------------------------------------------------

let timers = [];
let generation = 0; // a page's callbacks stop once the route changed

function every(ms, fn) {
  const mine = generation;
  let busy = false;
  const tick = async () => {
    if (busy || mine !== generation) return;
    busy = true;
    try { await fn(); } finally { busy = false; }
  };
  timers.push(setInterval(tick, ms));
  return tick();
}

function mount(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children.flat().filter((c) => c !== "" && c != null));
}

// --- who is asking and what they may do (decided by the server) -------------------------------

let me = null; // GET /v1/security/whoami: principal, permissions on the cluster, own bindings

function whoami(ns, topic) {
  const q = new URLSearchParams();
  if (ns) q.set("namespace", ns);
  if (topic) q.set("topic", topic);
  const qs = q.toString();
  return api("GET", "/v1/security/whoami" + (qs ? "?" + qs : ""));
}
// The permissions the principal holds on a namespace or a topic, as the server decides them.
async function permissionsOn(ns, topic) { return new Set((await whoami(ns, topic)).permissions); }
// A permission on the cluster (everything shows when the server could not tell).
const may = (permission) => !me || me.permissions.includes(permission);

const NAV_NEEDS = { cluster: "ManageBroker", namespaces: "ManageNamespace",
                    schemas: "ManageSchema", security: "ManageCluster" };
function showNav() {
  document.querySelector("header nav").hidden = false;
  for (const a of document.querySelectorAll("header nav a")) {
    const need = NAV_NEEDS[a.dataset.page];
    a.hidden = Boolean(need) && !may(need);
  }
  document.getElementById("principal").textContent =
    me && me.security_enabled ? "as " + me.principal : "";
}

// The sign-in prompt: shown instead of the page when the API answers 401.
function askToken(exc) {
  generation++;
  timers.forEach(clearInterval);
  timers = [];
  document.getElementById("error").hidden = true;
  notice("");
  document.querySelector("header nav").hidden = true;
  document.getElementById("principal").textContent = "";
  const field = h("input", { id: "login-token", type: "password", autocomplete: "off", size: 60,
                             placeholder: "bearer token", required: true });
  const why = token()
    ? `The token was refused (${exc.code}: ${exc.message}). Give another one.`
    : "Security is on: this cluster answers only requests that carry a bearer token.";
  mount(h("section", { id: "login", class: "login" },
    h("h1", {}, "Sign in with a token"),
    h("p", { id: "login-reason" }, why),
    h("form", { id: "login-form", class: "inline", onsubmit: (e) => {
      e.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, field.value.trim());
      showToken();
      route();
    } }, field, h("button", { type: "submit", class: "primary", id: "login-submit" }, "Sign in")),
    h("p", { class: "muted" }, "Make one with `danube admin security tokens create --principal <name>` " +
      "or exchange an API key with `danube admin security tokens exchange --api-key <key>`. " +
      "It is kept in this tab only (sessionStorage).")));
  field.focus();
}

function grantPlace(grant) {
  if (grant.scope === "namespace") return h("a", { href: `#/topics/${enc(grant.resource)}` }, grant.resource);
  if (grant.scope === "topic") {
    const [, ns, topic] = grant.resource.split("/");
    return h("a", { href: `#/topic/${enc(ns)}/${enc(topic)}` }, grant.resource);
  }
  return "everything";
}

async function accessPage() {
  if (!me) { mount(h("h1", {}, "My access"), h("p", { class: "muted" }, "Unknown.")); return; }
  const who = !me.security_enabled ? "Security is off: every request is served, as anonymous."
    : me.super_admin ? `${me.principal} is a super-admin (security.super_admins): everything is allowed.`
    : `Signed in as ${me.principal}.`;
  mount(h("h1", {}, "My access"), h("p", { id: "me" }, who),
    h("p", {}, "On the cluster: ", h("span", { id: "me-permissions" }, me.permissions.join(", ") || "nothing")),
    h("h2", {}, "Bindings"),
    me.grants.length ? table(["binding", "scope", "on", "roles", "permissions"], me.grants.map((g) =>
      h("tr", { "data-grant": g.binding }, h("td", {}, g.binding), h("td", {}, g.scope),
        h("td", {}, grantPlace(g)), h("td", {}, g.roles.join(", ")), h("td", {}, g.permissions.join(", ")))),
      { id: "grants-table" }) : h("p", { class: "muted" }, "No bindings."));
}

// --- cluster ---------------------------------------------------------------------------------

async function clusterPage() {
  const summary = h("div", { class: "cards", id: "cluster-cards" });
  const nodes = h("div", { id: "cluster-nodes" });
  mount(h("h1", {}, "Cluster"), summary, nodes);
  await every(REFRESH_INTERVAL_MS, async () => {
    try {
      const [cluster, placement, ready] = await Promise.all([
        api("GET", "/v1/cluster"), api("GET", "/v1/console/placement"), readyz(),
      ]);
      const perNode = Object.fromEntries(placement.nodes.map((n) => [n.node_id, n]));
      summary.replaceChildren(
        card("This instance", ready ? "ready" : "not ready", "ready"),
        card("Controller", cluster.controller.leader || "none", "controller"),
        card("Partitions", placement.partitions, "partitions"),
        card("Under-replicated", placement.under_replicated, "under-replicated"),
        card("Without leader", placement.without_leader, "without-leader"));
      const rows = [];
      for (const [kind, list] of Object.entries(cluster.nodes)) {
        for (const node of list) {
          const share = perNode[node.node_id];
          const role = node.node_id === cluster.controller.leader ? h("span", { class: "badge ok" }, "controller") : "";
          rows.push(h("tr", { "data-node": node.node_id },
            h("td", {}, kind), h("td", {}, node.node_id, " ", role), h("td", {}, node.address),
            h("td", {}, fmtTime(node.started_ms)), h("td", {}, h("span", { class: "badge ok" }, "live"),
              node.drained ? [" ", h("span", { class: "badge warn", title: "drained: its replicas move off, nothing new is placed on it" }, "drained")] : ""),
            h("td", { class: "num" }, share ? share.leader_of : ""),
            h("td", { class: "num" }, share ? share.replica_of : "")));
        }
      }
      nodes.replaceChildren(table(
        ["kind", "node", "address", "started (UTC)", "lease",
         h("th", { class: "num" }, "leader of"), h("th", { class: "num" }, "replica of")],
        rows, { id: "nodes-table" }));
    } catch (exc) { showError(exc); }
  });
}

async function readyz() {
  try { return (await fetch("/readyz")).ok; } catch (_) { return false; }
}

function card(label, value, id) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label),
    h("div", { class: "value", id: id ? "card-" + id : undefined }, fmt(value)));
}

// --- namespaces --------------------------------------------------------------------------------

async function namespacesPage() {
  const list = h("div", { id: "namespaces" });
  const name = h("input", { placeholder: "namespace", id: "ns-name", required: true });
  const create = h("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    await act(() => api("PUT", `/v1/namespaces/${enc(name.value)}`), `namespace ${name.value} created`);
    await load();
  } }, name, h("button", { type: "submit", class: "primary" }, "Create namespace"));
  mount(h("h1", {}, "Namespaces"), may("ManageNamespace") ? create : "", list);
  async function load() {
    try {
      const names = (await api("GET", "/v1/namespaces")).namespaces;
      const docs = await Promise.all(names.map((n) => api("GET", `/v1/namespaces/${enc(n)}`)));
      list.replaceChildren(table(
        ["name", "max topics", "retention (min)", "retention (MiB)", "replication factor",
         "min in-sync", "created (UTC)", ""],
        docs.map((ns) => namespaceRow(ns, load)), { id: "namespaces-table" }));
    } catch (exc) { showError(exc); }
  }
  await load();
}

function numberOrNull(input) {
  return input.value.trim() === "" ? null : Number(input.value);
}

function namespaceRow(ns, reload) {
  const f = {
    max_topics: h("input", { type: "number", min: 0, value: ns.max_topics, size: 6 }),
    time: h("input", { type: "number", min: 1, value: ns.retention.time_minutes ?? "", placeholder: "none" }),
    size: h("input", { type: "number", min: 1, value: ns.retention.size_mb ?? "", placeholder: "none" }),
    rf: h("input", { type: "number", min: 1, max: 7, value: ns.replication_factor ?? "", placeholder: "cluster" }),
    isr: h("input", { type: "number", min: 1, max: 7, value: ns.min_insync_replicas ?? "", placeholder: "cluster" }),
  };
  const save = h("button", { onclick: () => act(async () => {
    await api("PATCH", `/v1/namespaces/${enc(ns.name)}`, {
      max_topics: Number(f.max_topics.value),
      retention: { time_minutes: numberOrNull(f.time), size_mb: numberOrNull(f.size) },
      replication_factor: numberOrNull(f.rf), min_insync_replicas: numberOrNull(f.isr),
    });
    await reload();
  }, `namespace ${ns.name} saved`) }, "Save");
  const del = h("button", { class: "danger", onclick: () => {
    if (!confirm(`Delete namespace ${ns.name}?`)) return;
    act(async () => { await api("DELETE", `/v1/namespaces/${enc(ns.name)}`); await reload(); },
        `namespace ${ns.name} deleted`);
  } }, "Delete");
  return h("tr", { "data-namespace": ns.name },
    h("td", {}, h("a", { href: `#/topics/${enc(ns.name)}` }, ns.name)),
    h("td", {}, f.max_topics), h("td", {}, f.time), h("td", {}, f.size), h("td", {}, f.rf),
    h("td", {}, f.isr), h("td", {}, fmtTime(ns.created_ms)), h("td", {}, save, " ", del));
}

// --- topics ------------------------------------------------------------------------------------

async function topicsPage(nsParam) {
  const mine = generation;
  // Listing namespaces needs ManageNamespace on the cluster; without it, offer the namespaces
  // the principal's own bindings name.
  const namespaces = may("ManageNamespace")
    ? (await api("GET", "/v1/namespaces").catch((e) => { showError(e); return { namespaces: [] }; })).namespaces
    : [...new Set((me ? me.grants : []).filter((g) => g.scope !== "cluster")
        .map((g) => (g.scope === "namespace" ? g.resource : g.resource.split("/")[1])))];
  if (nsParam && !namespaces.includes(nsParam)) namespaces.push(nsParam);
  if (mine !== generation) return; // the route changed while asking
  const ns = nsParam || (namespaces.includes("default") ? "default" : namespaces[0]);
  const held = ns ? await permissionsOn(ns).catch((e) => { showError(e); return new Set(); }) : new Set();
  if (mine !== generation) return;
  const pick = h("select", { id: "topics-ns", onchange: () => { location.hash = `#/topics/${enc(pick.value)}`; } },
    namespaces.map((n) => h("option", { value: n, selected: n === ns }, n)));
  const search = h("input", { id: "topic-search", type: "search", placeholder: "search topics" });
  const list = h("div", { id: "topics" });
  const name = h("input", { id: "new-topic", placeholder: "topic name", required: true });
  const parts = h("input", { id: "new-partitions", type: "number", min: 0, max: 1024, value: 0, size: 4 });
  const dispatch = h("select", { id: "new-dispatch" }, h("option", {}, "reliable"), h("option", {}, "non_reliable"));
  const create = h("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    const created = await act(() => api("PUT", topicPath(ns, name.value), {
      partitions: Number(parts.value), dispatch: dispatch.value,
    }), (doc) => `topic ${doc.name} created`);
    if (created) { name.value = ""; await refresh(); }
  } }, name, h("label", {}, "partitions ", parts), dispatch,
     h("button", { type: "submit", class: "primary", id: "create-topic" }, "Create topic"));
  if (!held.has("ManageTopic")) {
    const granted = (me ? me.grants : []).filter((g) => g.scope === "topic" && g.resource.startsWith(`/${ns}/`));
    mount(h("h1", {}, "Topics"), h("div", { class: "row" }, "Namespace ", pick),
      h("p", { class: "muted", id: "topics-denied" }, ns ? `Listing the topics of ${ns} needs ManageTopic there.` : "No namespace."),
      granted.length ? h("ul", { id: "granted-topics" }, granted.map((g) => h("li", {}, grantPlace(g)))) : "");
    return;
  }
  mount(h("h1", {}, "Topics"), h("div", { class: "row" }, "Namespace ", pick, search), create, list);

  let topics = [];
  const stats = new Map(); // topic -> {now, prev}
  let sortKey = "name";
  let sortDir = 1;
  search.addEventListener("input", render);

  function rate(entry) {
    if (!entry || !entry.prev || entry.now.messages === null || entry.prev.messages === null) return null;
    const dt = (entry.now.time_ms - entry.prev.time_ms) / 1000;
    const d = entry.now.messages - entry.prev.messages;
    return dt > 0 && d >= 0 ? d / dt : null;
  }
  function value(topic, key) {
    const entry = stats.get(topic);
    if (key === "name") return topic;
    if (key === "rate") return rate(entry) ?? -1;
    if (!entry) return -1;
    return entry.now[key] ?? -1;
  }
  function shown() {
    const q = search.value.trim().toLowerCase();
    const found = topics.filter((t) => t.toLowerCase().includes(q));
    found.sort((a, b) => {
      const x = value(a, sortKey), y = value(b, sortKey);
      return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    });
    return found;
  }
  function header(label, key) {
    return h("th", { class: "sortable" + (key === "name" ? "" : " num"), "data-sort": key, onclick: () => {
      sortDir = sortKey === key ? -sortDir : (key === "name" ? 1 : -1);
      sortKey = key;
      render();
    } }, label + (sortKey === key ? (sortDir > 0 ? " ▲" : " ▼") : ""));
  }
  function render() {
    const rows = shown().map((t) => {
      const entry = stats.get(t);
      const now = entry ? entry.now : null;
      const del = h("button", { class: "danger", "data-delete": t, onclick: () => {
        if (!confirm(`Delete topic /${ns}/${t}, its WAL and its objects?`)) return;
        act(async () => { await api("DELETE", topicPath(ns, t)); await refresh(); }, `topic /${ns}/${t} deleted`);
      } }, "Delete");
      return h("tr", { "data-topic": t },
        h("td", {}, h("a", { href: `#/topic/${enc(ns)}/${enc(t)}` }, t)),
        h("td", { class: "num" }, now ? now.partitions.length : "…"),
        h("td", { class: "num" }, now ? fmt(now.messages) : "…"),
        h("td", { class: "num" }, fmt(rate(entry))),
        h("td", { class: "num" }, now ? fmt(now.backlog) : "…"),
        h("td", { class: "num" }, now ? now.subscriptions : "…"),
        h("td", {}, del));
    });
    list.replaceChildren(
      h("p", { class: "muted" }, `${topics.length} topics; counters for the first ${TOPIC_ROWS_MAX} shown, every ${REFRESH_INTERVAL_MS / 1000} s`),
      table([header("topic", "name"), h("th", { class: "num" }, "partitions"), header("messages", "messages"),
             header("msg/s", "rate"), header("backlog", "backlog"), h("th", { class: "num" }, "subscriptions"), ""],
            rows, { id: "topics-table" }));
  }
  async function refresh() {
    if (!ns) return;
    try {
      topics = (await api("GET", `/v1/namespaces/${enc(ns)}/topics`)).topics;
    } catch (exc) { showError(exc); return; }
    render();
    const wanted = shown().slice(0, TOPIC_ROWS_MAX);
    // At most 6 at a time, as a browser does per origin anyway.
    for (let i = 0; i < wanted.length; i += 6) {
      await Promise.all(wanted.slice(i, i + 6).map(async (t) => {
        try {
          const now = await api("GET", topicPath(ns, t) + "/stats");
          const old = stats.get(t);
          stats.set(t, { now, prev: old ? old.now : null });
        } catch (_) { /* deleted meanwhile: the next list drops it */ }
      }));
    }
    render();
  }
  await every(REFRESH_INTERVAL_MS, refresh);
}

// --- charts (hand-drawn SVG) ----------------------------------------------------------------------

function chart(id, title, format) {
  const width = 380, height = 120;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id });
  const value = h("span", { class: "value", id: id + "-value" }, "–");
  const box = h("div", { class: "chart" }, h("div", { class: "title" }, title, ": ", value), svg);
  const points = [];
  function draw() {
    svg.replaceChildren();
    const left = 44, bottom = height - 14, top = 8, right = width - 6;
    const known = points.filter((p) => p[1] !== null);
    const max = Math.max(1, ...known.map((p) => p[1]));
    svg.append(s("line", { class: "axis", x1: left, y1: bottom, x2: right, y2: bottom }),
               s("line", { class: "axis", x1: left, y1: top, x2: left, y2: bottom }));
    const label = s("text", { x: 2, y: top + 8 });
    label.textContent = format(max);
    const zero = s("text", { x: 2, y: bottom });
    zero.textContent = "0";
    svg.append(label, zero);
    if (points.length === 0) return;
    const t0 = points[0][0], span = Math.max(1, points[points.length - 1][0] - t0);
    const xy = known.map(([t, v]) =>
      `${(left + ((t - t0) / span) * (right - left)).toFixed(1)},${(bottom - (v / max) * (bottom - top)).toFixed(1)}`);
    svg.append(s("polyline", { points: xy.join(" ") }));
    svg.setAttribute("data-samples", String(points.length));
    svg.setAttribute("data-max", String(Math.max(0, ...known.map((p) => p[1]))));
  }
  draw();
  return {
    el: box,
    push(t, v) {
      points.push([t, v]);
      if (points.length > CHART_POINTS_MAX) points.shift();
      value.textContent = v === null ? "–" : format(v);
      svg.setAttribute("data-last", v === null ? "" : String(v));
      draw();
    },
  };
}

// --- payload preview ----------------------------------------------------------------------------

function base64Bytes(text) {
  const raw = atob(text);
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}
function hexDump(bytes) {
  const lines = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const row = Array.from(bytes.slice(i, i + 16));
    const hex = row.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = row.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(i.toString(16).padStart(6, "0") + "  " + hex.padEnd(48) + " " + ascii);
  }
  return lines.join("\n");
}
// What a payload looks like: pretty JSON, text, or a hex dump of binary.
function preview(message) {
  if (message.encoding === "base64") return { kind: "hex", text: hexDump(base64Bytes(message.payload)) };
  try {
    const doc = JSON.parse(message.payload);
    if (doc !== null && typeof doc === "object") return { kind: "json", text: JSON.stringify(doc, null, 2) };
  } catch (_) { /* not JSON */ }
  return { kind: "text", text: message.payload };
}

// --- topic page ---------------------------------------------------------------------------------

async function topicPage(ns, topic) {
  const mine = generation;
  const held = await permissionsOn(ns, topic).catch((e) => { showError(e); return new Set(); });
  if (mine !== generation) return;
  const base = topicPath(ns, topic);
  const cards = h("div", { class: "cards" });
  const rateChart = chart("chart-rate", "messages/s", fmt);
  const bytesChart = chart("chart-bytes", "bytes/s (WAL)", (v) => fmtBytes(v) + "/s");
  const backlogChart = chart("chart-backlog", "backlog", fmt);
  const partitions = h("div", { id: "partitions" });
  const subs = h("div", { id: "subscriptions" });
  const peekOut = h("div", { id: "peek" });
  const peekCount = h("input", { id: "peek-count", type: "number", min: 1, max: 100, value: 10, size: 4 });
  const payload = h("textarea", { id: "produce-payload", placeholder: "payload" });
  const key = h("input", { id: "produce-key", placeholder: "key (optional)" });
  const encoding = h("select", { id: "produce-encoding" }, h("option", {}, "utf8"), h("option", {}, "base64"));
  const produce = h("form", { id: "produce-form", onsubmit: async (e) => {
    e.preventDefault();
    const message = { payload: payload.value, encoding: encoding.value };
    if (key.value) message.key = key.value;
    await act(() => api("POST", base + "/messages", { messages: [message], producer: "console" }),
      (doc) => `produced at offset ${doc.results[0].offset} of ${doc.results[0].partition}`);
  } }, payload, h("div", { class: "row" }, key, encoding,
     h("button", { type: "submit", class: "primary", id: "produce" }, "Produce")));
  const del = h("button", { class: "danger", id: "delete-topic", onclick: () => {
    if (!confirm(`Delete topic /${ns}/${topic}, its WAL and its objects?`)) return;
    act(async () => { await api("DELETE", base); location.hash = `#/topics/${enc(ns)}`; },
        `topic /${ns}/${topic} deleted`);
  } }, "Delete topic");
  // Growing the topic (never shrinking): the PATCH answers 409 partitions_cannot_shrink or
  // not_partitioned, shown as any error is. Keyed messages then route over the new count.
  const growCount = h("input", { id: "grow-count", type: "number", min: 1, max: 1024, size: 5, placeholder: "N" });
  const grow = h("form", { id: "grow-form", class: "row", onsubmit: async (e) => {
    e.preventDefault();
    await act(async () => {
      const doc = await api("PATCH", base, { partitions: Number(growCount.value) });
      await describe();
      return doc;
    }, (doc) => `/${ns}/${topic} has ${doc.config.partitions} partitions`);
  } }, "grow to ", growCount, " partitions ",
     h("button", { type: "submit", id: "grow" }, "Grow"));
  // Only what the principal may do: describing the topic and its counters need ManageTopic,
  // producing Produce, peeking and seeking Consume.
  const manage = held.has("ManageTopic");
  mount(
    h("h1", {}, `/${ns}/${topic} `, manage ? del : ""),
    manage ? [cards, h("div", { class: "charts" }, rateChart.el, bytesChart.el, backlogChart.el),
              h("h2", {}, "Partitions"), grow, partitions, h("h2", {}, "Subscriptions"), subs]
      : h("p", { class: "muted", id: "describe-denied" }, "Partitions, subscriptions and live counters need ManageTopic on this topic."),
    h("div", { class: "grid2" },
      held.has("Produce") ? h("div", {}, h("h2", {}, "Produce a test message"), produce) : "",
      held.has("Consume") ? h("div", {}, h("h2", {}, "Peek the last messages"),
        h("div", { class: "row" }, "last ", peekCount,
          h("button", { id: "peek-button", onclick: () => act(async () => showPeek(await api("GET", `${base}/peek?count=${enc(peekCount.value)}`))) }, "Peek")),
        peekOut) : ""));

  function showPeek(doc) {
    const rows = doc.messages.map((m) => {
      const p = preview(m);
      return h("tr", { "data-offset": m.offset },
        h("td", {}, m.partition.split("/").pop()), h("td", { class: "num" }, m.offset),
        h("td", {}, fmtTime(m.publish_time_ms)), h("td", {}, m.key ?? ""),
        h("td", {}, h("span", { class: "badge" }, p.kind), " ", fmtBytes(m.size_bytes)),
        h("td", {}, h("pre", { class: "payload" }, p.text)));
    });
    peekOut.replaceChildren(
      doc.unavailable.length ? h("p", { class: "muted" }, "not answering: " + doc.unavailable.join(", ")) : "",
      table(["partition", "offset", "published (UTC)", "key", "preview", "payload"], rows, { id: "peek-table" }));
  }

  let prev = null;
  const sample = async () => {
    try {
      const now = await api("GET", base + "/stats");
      const t = now.time_ms;
      let r = null, b = null;
      if (prev && t > prev.time_ms) {
        const dt = (t - prev.time_ms) / 1000;
        if (now.messages !== null && prev.messages !== null && now.messages >= prev.messages) r = (now.messages - prev.messages) / dt;
        if (now.bytes_written !== null && prev.bytes_written !== null && now.bytes_written >= prev.bytes_written) b = (now.bytes_written - prev.bytes_written) / dt;
      }
      prev = now;
      rateChart.push(t, r);
      bytesChart.push(t, b);
      backlogChart.push(t, now.backlog);
      cards.replaceChildren(card("Messages (next offsets)", now.messages, "messages"),
                            card("Backlog", now.backlog, "backlog"),
                            card("Subscriptions", now.subscriptions, "subscriptions"));
    } catch (exc) { showError(exc); }
  };
  const describe = async () => {
    try {
      const doc = await api("GET", base);
      showPartitions(doc);
      showSubscriptions(doc.subscriptions);
    } catch (exc) { showError(exc); }
  };
  function showPartitions(doc) {
    partitions.replaceChildren(
      h("p", { class: "muted" }, `${doc.config.dispatch}, durability ${doc.config.durability}, ` +
        `${doc.config.partitions} partitions, created ${fmtTime(doc.config.created_ms)} UTC`),
      table(["partition", "leader", "epoch", "replicas", "in sync", "WAL start", "WAL end", "uploaded through"],
        doc.partitions.map((p) => {
          const o = p.offsets;
          const replicas = o.replicas || [];
          const isr = o.isr || [];
          const short = replicas.length && isr.length < replicas.length;
          return h("tr", { "data-partition": p.name },
            h("td", {}, p.name), h("td", {}, p.owner ? p.owner.node_id : h("span", { class: "badge bad" }, "none")),
            h("td", { class: "num" }, p.owner ? p.owner.epoch : "–"), h("td", {}, replicas.join(", ")),
            h("td", {}, h("span", { class: "badge " + (short ? "bad" : "ok") }, isr.join(", ") || "–")),
            h("td", { class: "num" }, fmt(o.wal_start)), h("td", { class: "num wal-end" }, fmt(o.next_offset)),
            h("td", { class: "num" }, fmt(o.uploaded_through)));
        }), { id: "partitions-table" }));
  }
  function showSubscriptions(list) {
    if (!list.length) { subs.replaceChildren(h("p", { class: "muted" }, "No subscriptions.")); return; }
    subs.replaceChildren(table(["subscription", "type", "backlog", "consumers", "cursors", "seek", "skip", ""],
      list.map((sub) => subscriptionRow(ns, topic, sub, describe, held)), { id: "subscriptions-table" }));
  }
  if (!manage) return;
  every(STATS_INTERVAL_MS, sample);
  // Same cadence as the counters, so the tables and the cards agree.
  await every(STATS_INTERVAL_MS, describe);
}

function subscriptionRow(ns, topic, sub, reload, held) {
  const base = `${topicPath(ns, topic)}/subscriptions/${enc(sub.name)}`;
  const kind = h("select", { class: "seek-kind" },
    ["earliest", "latest", "offset", "time"].map((k) => h("option", { value: k }, k)));
  const at = h("input", { class: "seek-at", placeholder: "offset or ISO time", size: 16 });
  const seek = h("button", { class: "seek", onclick: () => act(async () => {
    let position = kind.value;
    if (kind.value === "offset") position = { offset: Number(at.value) };
    if (kind.value === "time") {
      const ms = Date.parse(at.value);
      if (Number.isNaN(ms)) throw new ApiError(0, "invalid_time", `not a time: ${at.value}`);
      position = { timestamp_ms: ms };
    }
    const doc = await api("POST", base + "/seek", { position });
    await reload();
    return doc;
  }, (doc) => "cursor moved: " + doc.partitions.map((p) => `${p.name} → ${p.offset}`).join(", ")) }, "Seek");
  const skipPart = h("input", { class: "skip-partition", type: "number", min: 0, placeholder: "partition", size: 6 });
  const skipTo = h("input", { class: "skip-to", type: "number", min: 0, placeholder: "to offset (damage: empty)", size: 10 });
  const skip = h("button", { class: "skip", onclick: () => {
    if (!confirm(`Skip messages of ${sub.name}? They will never be delivered to it.`)) return;
    const body = {};
    if (skipPart.value !== "") body.partition = Number(skipPart.value);
    if (skipTo.value !== "") body.to_offset = Number(skipTo.value);
    act(async () => { const doc = await api("POST", base + "/skip", body); await reload(); return doc; },
        (doc) => `skipped ${doc.skipped} of ${doc.partition}: ${doc.from_offset} → ${doc.to_offset}`);
  } }, "Skip");
  const del = h("button", { class: "danger delete-subscription", onclick: () => {
    if (!confirm(`Delete subscription ${sub.name} and detach its consumers?`)) return;
    act(async () => { await api("DELETE", base); await reload(); }, `subscription ${sub.name} deleted`);
  } }, "Delete");
  const consumers = (sub.consumers || []).map((c) => `${c.name} (${c.unacked} unacked)`).join(", ");
  const cursors = (sub.partitions || []).map((p) =>
    `${p.name.split("/").pop()}: ${fmt(p.cursor)}/${fmt(p.end_offset)}` + (p.damaged ? " DAMAGED" : "") +
    (p.blocked_offset != null ? ` blocked at ${p.blocked_offset}` : "")).join("; ");
  return h("tr", { "data-subscription": sub.name },
    h("td", {}, sub.name), h("td", {}, sub.type), h("td", { class: "num sub-backlog" }, fmt(sub.backlog)),
    h("td", {}, consumers || h("span", { class: "muted" }, "none")), h("td", {}, cursors),
    h("td", {}, held.has("Consume") ? h("div", { class: "row" }, kind, at, seek) : ""),
    h("td", {}, h("div", { class: "row" }, skipPart, skipTo, skip)), h("td", {}, del));
}

// --- schemas ------------------------------------------------------------------------------------

const MODES = ["none", "backward", "forward", "full", "backward_transitive", "forward_transitive", "full_transitive"];

async function schemasPage(subject) {
  const list = h("div", { id: "subjects" });
  const detail = h("div", { id: "subject" });
  mount(h("h1", {}, "Schemas"), h("div", { class: "grid2" }, list, detail));
  try {
    const subjects = (await api("GET", "/v1/schemas")).subjects;
    list.replaceChildren(h("h2", {}, "Subjects"), subjects.length
      ? h("ul", {}, subjects.map((x) => h("li", {}, h("a", { href: `#/schemas/${enc(x)}` }, x))))
      : h("p", { class: "muted" }, "No subjects."));
  } catch (exc) { showError(exc); }
  if (!subject) return;
  try {
    const [versions, mode] = await Promise.all([
      api("GET", `/v1/schemas/${enc(subject)}/versions`), api("GET", `/v1/schemas/${enc(subject)}/mode`)]);
    const pickMode = h("select", { id: "schema-mode" }, MODES.map((m) => h("option", { value: m, selected: m === mode.mode }, m)));
    const setMode = h("button", { onclick: () => act(() => api("PUT", `/v1/schemas/${enc(subject)}/mode`, { mode: pickMode.value }),
      (doc) => `compatibility of ${doc.subject}: ${doc.mode}`) }, "Set");
    const vs = versions.versions;
    const a = h("select", { id: "diff-a" }, vs.map((v, i) => h("option", { value: i, selected: i === Math.max(0, vs.length - 2) }, "v" + v.version)));
    const b = h("select", { id: "diff-b" }, vs.map((v, i) => h("option", { value: i, selected: i === vs.length - 1 }, "v" + v.version)));
    const diffOut = h("div", { id: "diff" });
    const showDiff = () => diffOut.replaceChildren(diffView(vs[a.value]?.schema || "", vs[b.value]?.schema || ""));
    a.addEventListener("change", showDiff);
    b.addEventListener("change", showDiff);
    detail.replaceChildren(h("h2", {}, subject),
      h("div", { class: "row" }, "Compatibility ", pickMode, setMode),
      table(["version", "id", "type", "created (UTC)", "by", "description"], vs.map((v) =>
        h("tr", {}, h("td", {}, "v" + v.version), h("td", {}, v.schema_id), h("td", {}, v.schema_type),
          h("td", {}, fmtTime(v.created_ms)), h("td", {}, v.created_by), h("td", {}, v.description))), { id: "versions-table" }),
      h("h2", {}, "Diff"), h("div", { class: "row" }, a, " → ", b), diffOut);
    showDiff();
  } catch (exc) { showError(exc); }
}

// A line diff (longest common subsequence; schemas are small, capped at 2000 lines a side).
function diffView(oldText, newText) {
  const x = oldText.split("\n").slice(0, 2000), y = newText.split("\n").slice(0, 2000);
  const n = x.length, m = y.length;
  const lcs = Array.from({ length: n + 1 }, () => new Uint16Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
    lcs[i][j] = x[i] === y[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const lines = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && x[i] === y[j]) { lines.push(h("div", {}, "  " + x[i])); i++; j++; }
    else if (j < m && (i >= n || lcs[i][j + 1] >= lcs[i + 1][j])) { lines.push(h("div", { class: "add" }, "+ " + y[j])); j++; }
    else { lines.push(h("div", { class: "del" }, "- " + x[i])); i++; }
  }
  return h("pre", { class: "diff" }, lines);
}

// --- security: roles and bindings (ManageCluster) ------------------------------------------------

async function securityPage() {
  const roles = h("div", { id: "roles" });
  const bindings = h("div", { id: "bindings" });
  const roleName = h("input", { id: "role-name", placeholder: "role name", required: true, pattern: "[A-Za-z0-9_\\-]{1,128}" });
  const checks = PERMISSIONS.map((p) => h("input", { type: "checkbox", value: p, "data-permission": p }));
  const roleForm = h("form", { id: "role-form", onsubmit: async (e) => {
    e.preventDefault();
    const permissions = checks.filter((c) => c.checked).map((c) => c.value);
    if (!permissions.length) { showError(new ApiError(0, "no_permission", "tick at least one permission")); return; }
    const done = await act(() => api("PUT", `/v1/security/roles/${enc(roleName.value)}`, { permissions }),
      (doc) => `role ${doc.name} saved: ${doc.permissions.join(", ")}`);
    if (done) { roleName.value = ""; checks.forEach((c) => { c.checked = false; }); await load(); }
  } }, h("div", { class: "row" }, roleName, h("button", { type: "submit", class: "primary", id: "create-role" }, "Create role")),
     h("div", { class: "row checks" }, checks.map((c) => h("label", {}, c, " ", c.value))));

  const bindingId = h("input", { id: "binding-id", placeholder: "binding id", required: true, pattern: "[A-Za-z0-9_\\-]{1,128}" });
  const principal = h("input", { id: "binding-principal", placeholder: "principal", required: true });
  const roleChoice = h("select", { id: "binding-roles", multiple: true, size: 4, required: true });
  const scope = h("select", { id: "binding-scope" }, ["cluster", "namespace", "topic"].map((x) => h("option", { value: x }, x)));
  const resource = h("input", { id: "binding-resource", placeholder: "everything", disabled: true, size: 24 });
  scope.addEventListener("change", () => {
    resource.disabled = scope.value === "cluster";
    resource.placeholder = { cluster: "everything", namespace: "namespace", topic: "/namespace/topic" }[scope.value];
    if (resource.disabled) resource.value = "";
  });
  const bindingForm = h("form", { id: "binding-form", class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    const body = { principal: principal.value, roles: Array.from(roleChoice.selectedOptions, (o) => o.value),
                   scope: scope.value, resource: resource.value };
    const done = await act(() => api("PUT", `/v1/security/bindings/${enc(bindingId.value)}`, body),
      (doc) => `binding ${doc.id} saved: ${doc.principal} has ${doc.roles.join(", ")} on ${doc.scope === "cluster" ? "the cluster" : doc.scope + " " + doc.resource}`);
    if (done) { bindingId.value = ""; principal.value = ""; resource.value = ""; await load(); }
  } }, bindingId, principal, h("label", {}, "roles ", roleChoice), h("label", {}, "scope ", scope), resource,
     h("button", { type: "submit", class: "primary", id: "create-binding" }, "Create binding"));

  mount(h("h1", {}, "Security"),
    h("h2", {}, "Roles"), roleForm, roles,
    h("h2", {}, "Bindings"), bindingForm, bindings);

  async function load() {
    try {
      const [r, b] = await Promise.all([api("GET", "/v1/security/roles"), api("GET", "/v1/security/bindings")]);
      const chosen = new Set(Array.from(roleChoice.selectedOptions, (o) => o.value));
      roleChoice.replaceChildren(...r.roles.map((x) => h("option", { value: x.name, selected: chosen.has(x.name) }, x.name)));
      roles.replaceChildren(r.roles.length ? table(["role", "permissions", "created (UTC)", ""], r.roles.map((x) =>
        h("tr", { "data-role": x.name }, h("td", {}, x.name), h("td", {}, x.permissions.join(", ")),
          h("td", {}, fmtTime(x.created_ms)), h("td", {}, h("button", { class: "danger delete-role", onclick: () => {
            if (!confirm(`Delete role ${x.name}?`)) return;
            act(async () => { await api("DELETE", `/v1/security/roles/${enc(x.name)}`); await load(); }, `role ${x.name} deleted`);
          } }, "Delete")))), { id: "roles-table" }) : h("p", { class: "muted" }, "No roles."));
      bindings.replaceChildren(b.bindings.length ? table(["binding", "principal", "roles", "scope", "resource", "created (UTC)", ""],
        b.bindings.map((x) => h("tr", { "data-binding": x.id }, h("td", {}, x.id), h("td", {}, x.principal),
          h("td", {}, x.roles.join(", ")), h("td", {}, x.scope), h("td", {}, x.resource || "–"), h("td", {}, fmtTime(x.created_ms)),
          h("td", {}, h("button", { class: "danger delete-binding", onclick: () => {
            if (!confirm(`Delete binding ${x.id} (${x.principal})? Its grants end at once.`)) return;
            act(async () => { await api("DELETE", `/v1/security/bindings/${enc(x.id)}`); await load(); }, `binding ${x.id} deleted`);
          } }, "Delete")))), { id: "bindings-table" }) : h("p", { class: "muted" }, "No bindings."));
    } catch (exc) { showError(exc); }
  }
  await load();
}

// --- routing --------------------------------------------------------------------------------------

async function route() {
  generation++;
  timers.forEach(clearInterval);
  timers = [];
  showError(null);
  const mine = generation;
  try {
    me = await whoami();
  } catch (exc) {
    if (mine !== generation) return;
    me = null;
    if (exc.status === 401) { askToken(exc); return; }
    showError(exc); // an older server, say: show everything, the API still decides
  }
  if (mine !== generation) return;
  showNav();
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = parts[0] || (may("ManageBroker") ? "cluster" : "access");
  for (const a of document.querySelectorAll("header nav a"))
    a.classList.toggle("active", a.dataset.page === (page === "topic" ? "topics" : page));
  try {
    if (page === "namespaces") await namespacesPage();
    else if (page === "topics") await topicsPage(parts[1]);
    else if (page === "topic" && parts.length >= 3) await topicPage(parts[1], parts[2]);
    else if (page === "schemas") await schemasPage(parts[1]);
    else if (page === "security") await securityPage();
    else if (page === "access") await accessPage();
    else await clusterPage();
  } catch (exc) { showError(exc); }
}

function showToken() {
  document.getElementById("token-state").textContent = token() ? "token set" : "no token";
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const field = document.getElementById("token");
    if (field.value) sessionStorage.setItem(TOKEN_KEY, field.value);
    field.value = "";
    showToken();
    route();
  });
  document.getElementById("token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showToken();
    route();
  });
  showToken();
  window.addEventListener("hashchange", route);
  route();
});
