// The polymq operator console: a single page that reads only the admin JSON API
// (docs/admin-api.md) with fetch and EventSource. Pages are hash routes: #/overview,
// #/connections, #/destinations, #/destinations/<kind>/<name>, #/cluster.
"use strict";
(() => {
  const view = document.getElementById("view");
  const banners = document.getElementById("banners");
  const REFRESH = 5000; // ms between two readings of a list page
  const WINDOW = 600; // seconds of history a chart shows
  const INTERNAL = "polymq-internal"; // the user polymq's own links log in as (polymq.auth)
  let teardown = []; // what the current page stops when another is shown
  let flash = ""; // a status to show on the next page (e.g. after a delete)

  // ---- DOM and formatting helpers ---------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c !== undefined && c !== null && c !== false) el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }
  const num = (n) => (n === undefined || n === null ? "–" : Number(n).toLocaleString("en"));
  const rate = (n) =>
    n === undefined || n === null ? "–" : Number(n) < 10 ? Number(n).toFixed(1) : Math.round(n).toLocaleString("en");
  function bytes(n) {
    if (n === undefined || n === null || n < 0) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${n < 10 && i ? n.toFixed(1) : Math.round(n)} ${units[i]}`;
  }
  function duration(s) {
    s = Math.max(0, Math.floor(s));
    const d = Math.floor(s / 86400), hr = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    return d ? `${d}d ${hr}h` : hr ? `${hr}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
  }
  const since = (epoch) => (epoch ? new Date(epoch * 1000).toLocaleString() : "–");
  const enc = encodeURIComponent;

  // a table of rows; on a phone each row becomes a card (the labels come from data-label)
  function table(columns, rows, attrs) {
    const head = h("tr", {}, columns.map((c) => c.head || h("th", { class: c.text ? "text" : null, scope: "col" }, c.label)));
    const body = rows.map((row) =>
      h("tr", row.attrs || {}, columns.map((c) => h("td", { "data-label": c.label, class: c.text ? "text" : null }, h("span", {}, c.cell(row))))),
    );
    if (!rows.length) body.push(h("tr", {}, h("td", { colspan: columns.length, class: "text note" }, attrs?.empty || "none")));
    // (a small table stays a table on a phone: attrs.plain)
    return h("table", { class: attrs?.plain ? null : "rows", ...(attrs?.table || {}) }, h("thead", {}, head), h("tbody", {}, body));
  }

  // ---- the API ------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, title, detail) {
      super(`${status} ${title}${detail ? `: ${detail}` : ""}`);
      this.status = status;
      this.title = title;
      this.detail = detail;
    }
  }
  async function api(path, options = {}) {
    const init = { method: options.method || "GET", credentials: "same-origin", headers: { Accept: "application/json" } };
    if (options.body !== undefined) {
      init.body = JSON.stringify(options.body);
      init.headers["Content-Type"] = "application/json";
    }
    const r = await fetch(path, init);
    const type = r.headers.get("Content-Type") || "";
    const data = r.status === 204 ? null : type.includes("json") ? await r.json() : await r.text();
    if (!r.ok) {
      const p = data && typeof data === "object" ? data : {};
      throw new ApiError(r.status, p.title || r.statusText, p.detail || (typeof data === "string" ? data.trim() : ""));
    }
    return data;
  }
  function explain(err) {
    if (err instanceof ApiError) {
      if (err.status === 401) return "Not logged in (401): this console needs a polymq login. Reload the page to be asked for a user and password.";
      if (err.status === 403) return `Not allowed (403): your user lacks the tag for this (looking needs "monitoring", changing needs "administrator"). ${err.detail || ""}`;
      return `The server refused (${err.message}).`;
    }
    return `The admin server cannot be reached (${err.message || err}): is the node running?`;
  }
  // a problem's banner: the page's (#problem) or the live stream's (#live-problem), each
  // cleared only by its own next success
  function problem(err, id = "problem") {
    let el = document.getElementById(id);
    if (!err) { if (el) el.remove(); return; }
    if (!el) { el = h("p", { id, class: "problem", role: "alert" }); banners.append(el); }
    el.textContent = explain(err);
  }
  // run a page's loader now and every REFRESH ms while the page is shown
  function every(load) {
    let stopped = false;
    let timer = 0;
    const tick = async () => {
      try { await load(); problem(null); } catch (err) { if (!stopped) problem(err); }
      if (!stopped) timer = setTimeout(tick, REFRESH);
    };
    teardown.push(() => { stopped = true; clearTimeout(timer); });
    tick();
  }
  function status(el, text, bad) {
    el.textContent = text;
    el.className = bad ? "problem" : "status";
  }

  // ---- live: one EventSource for every page (the alarms' banners, the overview) -------------
  const live = { listeners: new Set(), last: null, source: null, indicator: null };
  function setLive(on, text) {
    if (!live.indicator) return;
    live.indicator.className = `live ${on ? "on" : "off"}`;
    live.indicator.textContent = text;
  }
  function showAlarms(doc) {
    document.getElementById("node").textContent = `${doc.node} · ${doc.version}`;
    document.title = `polymq ${doc.node}`;
    for (const el of banners.querySelectorAll(".alarm")) el.remove();
    for (const resource of doc.alarms || []) {
      const m = resource === "memory"
        ? `memory alarm is on: ${bytes(doc.memory.used_bytes)} used, high watermark ${bytes(doc.memory.limit_bytes)}` +
          (doc.memory.clears_at_bytes ? `; it clears under ${bytes(doc.memory.clears_at_bytes)}` : "")
        : resource === "disk"
          ? `disk alarm is on: ${bytes(doc.disk.free_bytes)} free, limit ${bytes(doc.disk.limit_bytes)}`
          : `${resource} alarm is on`;
      banners.prepend(h("p", { class: "alarm", role: "alert", "data-alarm": resource }, `${m} — publishers are held until it clears.`));
    }
  }
  function startLive() {
    const source = (live.source = new EventSource("/api/overview/stream"));
    source.addEventListener("overview", (ev) => {
      const doc = JSON.parse(ev.data);
      live.last = doc;
      problem(null, "live-problem");
      setLive(true, "live");
      showAlarms(doc);
      for (const f of live.listeners) f(doc);
    });
    source.onerror = async () => {
      setLive(false, "live updates interrupted: reconnecting");
      if (source.readyState !== EventSource.CLOSED) return; // it reconnects by itself
      try { await api("/api/overview"); } catch (err) { problem(err, "live-problem"); }
      setTimeout(startLive, REFRESH);
    };
  }

  // ---- Overview -----------------------------------------------------------------------------
  function card(label, key) {
    return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value", "data-metric": key }, "–"));
  }
  function gauge(label, key) {
    return h("div", { class: "gauge", "data-gauge": key }, h("div", { class: "label" }, label),
      h("div", { class: "bar" }, h("span", { style: "width:0%" })), h("div", { class: "note" }, "–"));
  }
  function setGauge(key, part, whole, text, over) {
    const g = view.querySelector(`[data-gauge="${key}"]`);
    if (!g) return;
    g.querySelector(".bar span").style.width = `${whole > 0 ? Math.min(100, (100 * part) / whole) : 0}%`;
    g.querySelector(".bar").classList.toggle("over", over);
    g.querySelector(".note").textContent = text;
  }
  function makeChart(box, title, series) {
    const el = h("div", { class: "chart", "data-chart": title }, h("h3", {}, title));
    box.append(el);
    const width = () => Math.max(200, el.clientWidth - 16);
    const opts = {
      width: width(), height: 200,
      scales: { x: { time: true, range: (u, min, max) => { const end = max ?? Date.now() / 1000; return [end - WINDOW, end]; } } }, // the last 10 minutes
      series: [{}, ...series.map(([label, stroke]) => ({ label, stroke, width: 2, points: { show: false } }))],
      axes: [{}, { size: 50 }],
      legend: { live: false },
    };
    const plot = new uPlot(opts, [[], ...series.map(() => [])], el);
    const resize = new ResizeObserver(() => plot.setSize({ width: width(), height: 200 }));
    resize.observe(el);
    teardown.push(() => { resize.disconnect(); plot.destroy(); });
    return { el, plot };
  }
  async function overviewPage() {
    const cards = h("div", { class: "cards" },
      card("publish / s", "publish"), card("deliver / s", "deliver"), card("ack / s", "ack"),
      card("messages ready", "ready"), card("messages unacked", "unacked"), card("up", "uptime"));
    const charts = h("div", { class: "charts" });
    const protocols = h("div", { id: "protocols" });
    live.indicator = h("span", { class: "live off" }, "connecting…");
    view.replaceChildren(h("h1", {}, "Overview ", live.indicator), cards, h("h2", {}, "Last 10 minutes"), charts,
      h("div", { class: "grid2" },
        h("div", {}, h("h2", {}, "Connections and subscriptions"), protocols),
        h("div", {}, h("h2", {}, "Resources"), gauge("memory (resident, against the high watermark)", "memory"),
          h("p"), gauge("disk (free, against the limit)", "disk"))));
    const history = await api("/api/overview/history");
    const rates = makeChart(charts, "rates (messages/s)", [["publish", "#2457c5"], ["deliver", "#1e7b45"], ["ack", "#c77700"]]);
    const depth = makeChart(charts, "messages", [["ready", "#6b3fc4"], ["unacked", "#b3261e"]]);
    const keys = ["publish", "deliver", "ack", "ready", "unacked"];
    const cols = { t: [] };
    for (const k of keys) cols[k] = [];
    const add = (s) => {
      if (cols.t.length && s.t <= cols.t[cols.t.length - 1]) return;
      cols.t.push(s.t);
      for (const k of keys) cols[k].push(s[k]);
      while (cols.t.length && cols.t[0] < s.t - WINDOW) for (const k of ["t", ...keys]) cols[k].shift();
    };
    for (const s of history.samples) add(s);
    let received = 0;
    const draw = () => {
      rates.plot.setData([cols.t, cols.publish, cols.deliver, cols.ack]);
      depth.plot.setData([cols.t, cols.ready, cols.unacked]);
      for (const c of [rates, depth]) {
        c.el.dataset.points = cols.t.length;
        c.el.dataset.received = received;
      }
    };
    const show = (doc) => {
      for (const k of ["publish", "deliver", "ack"]) view.querySelector(`[data-metric="${k}"]`).textContent = rate(doc.rates[k]);
      view.querySelector('[data-metric="ready"]').textContent = num(doc.messages.ready);
      view.querySelector('[data-metric="unacked"]').textContent = num(doc.messages.unacked);
      view.querySelector('[data-metric="uptime"]').textContent = duration(doc.uptime_seconds);
      const names = [...new Set([...Object.keys(doc.connections), ...Object.keys(doc.subscriptions)])].sort();
      protocols.replaceChildren(table(
        [{ label: "protocol", text: true, cell: (r) => r.p }, { label: "connections", cell: (r) => num(doc.connections[r.p] || 0) },
          { label: "subscriptions", cell: (r) => num(doc.subscriptions[r.p] || 0) }],
        names.map((p) => ({ p, attrs: { "data-protocol": p } })), { empty: "no connections", plain: true, table: { id: "per-protocol" } }));
      const m = doc.memory, d = doc.disk;
      setGauge("memory", m.used_bytes, m.limit_bytes, `${bytes(m.used_bytes)} of ${bytes(m.limit_bytes)}`, (doc.alarms || []).includes("memory"));
      setGauge("disk", d.limit_bytes, d.free_bytes, `${bytes(d.free_bytes)} free, limit ${bytes(d.limit_bytes)}`, (doc.alarms || []).includes("disk"));
    };
    show(live.last || (await api("/api/overview")));
    draw();
    const listener = (doc) => {
      received += 1;
      add({ t: doc.t, ...doc.rates, ...doc.messages });
      show(doc);
      draw();
    };
    live.listeners.add(listener);
    if (live.last) setLive(true, "live");
    teardown.push(() => { live.listeners.delete(listener); live.indicator = null; });
  }

  // ---- Connections --------------------------------------------------------------------------
  function connectionsPage() {
    const box = h("div");
    const frontends = h("p", { class: "note" });
    const said = h("p", { role: "status" });
    const own = h("input", { type: "checkbox", id: "own" });
    view.replaceChildren(h("h1", {}, "Connections"), said,
      h("div", { class: "filters" }, h("label", {}, own, " show polymq's own links (frontends, peers)")), box, frontends);
    own.addEventListener("change", () => load().catch(problem));
    const before = new Map(); // id -> [seconds, messages_in, messages_out]
    const perSecond = (c, now) => {
      const b = before.get(c.id);
      before.set(c.id, [now, c.messages_in, c.messages_out]);
      if (!b || now <= b[0]) return ["–", "–"];
      return [rate((c.messages_in - b[1]) / (now - b[0])), rate((c.messages_out - b[2]) / (now - b[0]))];
    };
    const close = async (c, button) => {
      if (!confirm(`Close ${c.protocol} connection ${c.id} from ${c.peer}?`)) return;
      button.disabled = true;
      try {
        await api(`/api/connections/${enc(c.id)}`, { method: "DELETE" });
        status(said, `closed connection ${c.id} (${c.protocol}, ${c.peer})`);
        await load();
      } catch (err) { status(said, explain(err), true); button.disabled = false; }
    };
    const load = async () => {
      const doc = await api("/api/connections");
      const now = Date.now() / 1000;
      const all = doc.connections.map((c) => ({ ...c, rates: perSecond(c, now), attrs: { "data-connection": c.id } }));
      const rows = own.checked ? all : all.filter((c) => c.user !== INTERNAL);
      const hidden = all.length - rows.length;
      box.replaceChildren(table([
        { label: "protocol", text: true, cell: (c) => c.protocol },
        { label: "peer", text: true, cell: (c) => c.peer },
        { label: "user", text: true, cell: (c) => c.user || "–" },
        { label: "vhost", text: true, cell: (c) => c.vhost ?? "–" },
        { label: "subscriptions", cell: (c) => (c.channels !== undefined && c.channels !== null ? `${num(c.subscriptions)} / ${num(c.channels)} ch` : num(c.subscriptions)) },
        { label: "in / s", cell: (c) => c.rates[0] },
        { label: "out / s", cell: (c) => c.rates[1] },
        { label: "connected since", text: true, cell: (c) => since(c.connected_at) },
        { label: "node", text: true, cell: (c) => c.node || "–" },
        { label: "", cell: (c) => { const b = h("button", { class: "danger", type: "button" }, "Close"); b.addEventListener("click", () => close(c, b)); return b; } },
      ], rows, { empty: "no client connections", table: { id: "connections" } }));
      const silent = doc.frontends.filter((f) => !f.answered);
      frontends.textContent = `${doc.frontends.length} frontend(s) asked` +
        (silent.length ? `; no answer within 2 s from ${silent.map((f) => `${f.id} (${f.protocol})`).join(", ")}` : ", every one answered") +
        (hidden ? `; ${hidden} of polymq's own links hidden` : "") +
        ". Rates are computed from two readings 5 s apart.";
    };
    every(load);
  }

  // ---- Destinations -------------------------------------------------------------------------
  function normal(d, before, now) {
    const [kind, ...rest] = d.destination.split("/");
    const out = {
      ...d, kind: d.kind || kind, name: d.name ?? rest.join("/"),
      ready: d.ready ?? d.messages ?? 0, unacked: d.unacked ?? d.in_flight ?? 0,
      consumers: d.consumers ?? d.subscribers ?? 0, durable: d.durable ?? d.options?.durable,
    };
    // an API without rates: from two readings of the totals
    const b = before.get(d.destination);
    before.set(d.destination, [now, d.published, d.delivered]);
    if (out.publish_rate === undefined && b && now > b[0] && d.published !== undefined) out.publish_rate = (d.published - b[1]) / (now - b[0]);
    if (out.deliver_rate === undefined && b && now > b[0] && d.delivered !== undefined) out.deliver_rate = (d.delivered - b[2]) / (now - b[0]);
    return out;
  }
  function destinationsPage() {
    const state = { kind: "", q: "", sort: "name" };
    const kind = h("select", { id: "kind", "aria-label": "kind" }, ["", "queue", "topic", "stream", "channel"].map((k) => h("option", { value: k }, k || "every kind")));
    const q = h("input", { id: "filter", type: "search", placeholder: "name contains…", "aria-label": "name contains" });
    const box = h("div");
    const said = h("p", { role: "status" }, flash);
    flash = "";
    view.replaceChildren(h("h1", {}, "Destinations"), said, h("div", { class: "filters" }, kind, q), box);
    const before = new Map();
    let timer = 0;
    kind.addEventListener("change", () => { state.kind = kind.value; load().catch(problem); });
    q.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { state.q = q.value; load().catch(problem); }, 250); });
    const sorter = (key, label) => {
      const arrow = state.sort === key ? " ▲" : state.sort === `-${key}` ? " ▼" : "";
      const b = h("button", { class: "sort", type: "button", "data-sort": key }, label + arrow);
      b.addEventListener("click", () => { state.sort = state.sort === key ? `-${key}` : key; load().catch(problem); });
      return h("th", { scope: "col", class: `sortable${key === "name" ? " text" : ""}`, "aria-sort": arrow ? (arrow.includes("▲") ? "ascending" : "descending") : null }, b);
    };
    const load = async () => {
      const params = new URLSearchParams({ sort: state.sort, limit: "500" });
      if (state.kind) params.set("kind", state.kind);
      if (state.q) params.set("q", state.q);
      const doc = await api(`/api/destinations?${params}`);
      const now = Date.now() / 1000;
      let rows = doc.destinations.map((d) => normal(d, before, now));
      // (the same filter and order here: an older core ignores the query)
      rows = rows.filter((d) => (!state.kind || d.kind === state.kind) && (!state.q || d.name.includes(state.q)));
      const key = state.sort.replace(/^-/, ""), sign = state.sort.startsWith("-") ? -1 : 1;
      rows.sort((a, b) => sign * (key === "name" ? a.destination.localeCompare(b.destination) : a[key] - b[key]));
      for (const r of rows) r.attrs = { "data-destination": r.destination };
      box.replaceChildren(table([
        { label: "destination", text: true, head: sorter("name", "destination"), cell: (d) => h("a", { href: `#/destinations/${d.kind}/${enc(d.name)}` }, d.destination) },
        { label: "kind", text: true, cell: (d) => d.kind },
        { label: "ready", head: sorter("ready", "ready"), cell: (d) => h("span", { "data-field": "ready" }, num(d.ready)) },
        { label: "unacked", head: sorter("unacked", "unacked"), cell: (d) => h("span", { "data-field": "unacked" }, num(d.unacked)) },
        { label: "consumers", head: sorter("consumers", "consumers"), cell: (d) => num(d.consumers) },
        { label: "publish / s", cell: (d) => rate(d.publish_rate) },
        { label: "deliver / s", cell: (d) => rate(d.deliver_rate) },
        { label: "durable", cell: (d) => (d.durable === undefined ? "–" : d.durable ? "yes" : "no") },
      ], rows, { empty: "no destinations match", table: { id: "destinations" } }));
    };
    every(load);
    teardown.push(() => clearTimeout(timer));
  }

  function destinationPage(kind, name) {
    const path = `/api/destinations/${enc(kind)}/${enc(name)}`;
    const key = `${kind}/${name}`;
    const said = h("p", { role: "status" });
    const details = h("div");
    const peeked = h("div");
    const count = h("input", { id: "count", type: "number", min: 1, max: 100, value: 10, "aria-label": "messages to peek" });
    const act = async (button, what, run) => {
      button.disabled = true;
      try { await run(); } catch (err) { status(said, `${what}: ${explain(err)}`, true); } finally { button.disabled = false; }
    };
    const purge = h("button", { class: "danger", type: "button", id: "purge" }, "Purge");
    purge.addEventListener("click", () => {
      if (!confirm(`Purge every ready message of ${key}?`)) return;
      act(purge, "purge", async () => {
        const r = await api(`${path}/contents`, { method: "DELETE" });
        status(said, `purged ${num(r.purged)} message(s) from ${key}`);
        await load();
      });
    });
    const remove = h("button", { class: "danger", type: "button", id: "delete" }, "Delete");
    remove.addEventListener("click", () => {
      if (!confirm(`Delete ${key} and every message in it?`)) return;
      act(remove, "delete", async () => {
        // a 404 is a delete already done (the browser sends a request again by itself when
        // a kept-alive connection closes before the answer; another operator; a queue made
        // by a publish alone, which the core forgets once it is empty)
        let gone = "";
        try { await api(path, { method: "DELETE" }); } catch (err) {
          if (!(err instanceof ApiError && err.status === 404)) throw err;
          gone = " (it was already gone)";
        }
        flash = `deleted ${key}${gone}`;
        location.hash = "#/destinations";
      });
    });
    const peek = h("button", { type: "button", id: "peek" }, "Peek");
    peek.addEventListener("click", () => act(peek, "peek", async () => {
      const r = await api(`${path}/messages?count=${enc(count.value || 10)}`);
      peeked.replaceChildren(table([
        { label: "seq", cell: (m) => num(m.seq) },
        { label: "priority", cell: (m) => m.priority },
        { label: "persistent", cell: (m) => (m.persistent ? "yes" : "no") },
        { label: "redelivered", cell: (m) => (m.redelivered ? "yes" : "no") },
        { label: "content type", text: true, cell: (m) => m.content_type || "–" },
        { label: "headers", text: true, cell: (m) => (m.headers && Object.keys(m.headers).length ? JSON.stringify(m.headers) : "–") },
        { label: "body", text: true, cell: (m) => h("pre", { class: "body" }, m.body ?? `(base64) ${m.body_base64}`) },
      ], r.messages, { empty: "no ready messages", table: { id: "peeked" } }));
    }));
    const body = h("textarea", { id: "body", "aria-label": "body", required: true });
    const type = h("input", { id: "content-type", value: "text/plain", "aria-label": "content type" });
    const priority = h("input", { id: "priority", type: "number", min: 0, max: 9, value: 4, "aria-label": "priority" });
    const persistent = h("input", { id: "persistent", type: "checkbox" });
    const send = h("button", { type: "submit" }, "Publish");
    const form = h("form", { class: "publish" },
      h("label", {}, "Body", h("br"), body),
      h("div", { class: "filters" }, h("label", {}, "Content type ", type), h("label", {}, "Priority ", priority),
        h("label", {}, persistent, " persistent")), h("div", {}, send));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      act(send, "publish", async () => {
        const r = await api(`${path}/messages`, { method: "POST", body: {
          body: body.value, content_type: type.value || undefined,
          priority: Number(priority.value), persistent: persistent.checked } });
        status(said, `published message ${r.id}${r.seq !== undefined && r.seq !== null ? ` (seq ${r.seq})` : ""} to ${key}`);
        await load();
      });
    });
    view.replaceChildren(h("p", {}, h("a", { href: "#/destinations" }, "← destinations")), h("h1", {}, key), said, details,
      h("div", { class: "actions" }, purge, remove),
      h("h2", {}, "Peek (the first messages, not consumed)"), h("div", { class: "filters" }, count, peek), peeked,
      h("h2", {}, "Publish"), form);
    const load = async () => {
      const d = normal(await api(path), new Map(), 0);
      const shown = ["ready", "unacked", "consumers", "durable", "publish_rate", "deliver_rate", "paged"];
      const rest = Object.keys(d).filter((k) => !shown.includes(k) && !["destination", "kind", "name", "attrs", "messages", "in_flight", "subscribers"].includes(k));
      const fmt = (k, v) => (v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : k.endsWith("_rate") ? rate(v) : typeof v === "number" ? num(v) : String(v));
      details.replaceChildren(h("table", { id: "details" }, h("tbody", {}, [...shown, ...rest].filter((k) => d[k] !== undefined || shown.includes(k)).map((k) =>
        h("tr", {}, h("th", { scope: "row", class: "text" }, k.replace("_", " ")), h("td", { "data-field": k, class: "text" }, fmt(k, d[k])))))));
    };
    every(load);
  }

  // ---- Cluster ------------------------------------------------------------------------------
  function clusterPage() {
    const nodes = h("div");
    const shards = h("div");
    const k8s = h("p", { class: "note" });
    view.replaceChildren(h("h1", {}, "Cluster"), nodes, shards, k8s);
    const load = async () => {
      const doc = await api("/api/cluster");
      nodes.replaceChildren(table([
        { label: "node", text: true, cell: (n) => {
          const url = n.admin_url ? `${String(n.admin_url).replace(/\/$/, "")}/` : n.self ? "/" : "";
          return [url ? h("a", { href: url, "data-node": n.id }, n.id) : n.id, n.self ? " (this node)" : ""];
        } },
        { label: "state", text: true, cell: (n) => n.state },
        { label: "shards led", text: true, cell: (n) => (n.shards_led || []).join(", ") || "–" },
        { label: "configuration", cell: (n) => n.config_version || "–" },
        { label: "last heard", cell: (n) => (n.self ? "–" : n.last_heard_seconds_ago !== undefined ? `${Number(n.last_heard_seconds_ago).toFixed(1)} s ago` : "–") },
      ], doc.nodes.map((n) => ({ ...n, attrs: { "data-node-row": n.id } })), { table: { id: "nodes" } }));
      shards.replaceChildren(...(doc.shards ? [h("h2", {}, "Shards"), table([
        { label: "shard", cell: (s) => s.shard },
        { label: "leader", text: true, cell: (s) => s.leader || "–" },
        { label: "applied here", cell: (s) => num(s.applied) },
        { label: "replicas", text: true, cell: (s) => (s.peers || []).join(", ") || "–" },
      ], doc.shards, { table: { id: "shards" } })] : []));
      const k = doc.kubernetes;
      k8s.textContent = k ? `Kubernetes Service ${k.service}: ${k.members.map((m) => `${m.name} (${m.ready ? "ready" : "not ready"})`).join(", ") || "no pods"}${k.error ? ` (last error: ${k.error})` : ""}` : "";
    };
    every(load);
  }

  // ---- the router ---------------------------------------------------------------------------
  async function route() {
    for (const stop of teardown.splice(0)) stop();
    problem(null); // (the last page's)
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    const page = ["overview", "connections", "destinations", "cluster"].includes(parts[0]) ? parts[0] : "overview";
    for (const a of document.querySelectorAll("header nav a[data-page]")) {
      if (a.dataset.page === page) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    try {
      if (page === "destinations" && parts.length >= 3) destinationPage(decodeURIComponent(parts[1]), decodeURIComponent(parts.slice(2).join("/")));
      else if (page === "destinations") destinationsPage();
      else if (page === "connections") connectionsPage();
      else if (page === "cluster") clusterPage();
      else await overviewPage();
    } catch (err) { problem(err); }
  }
  window.addEventListener("hashchange", route);
  startLive();
  route();
})();
