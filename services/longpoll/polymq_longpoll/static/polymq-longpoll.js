/* polymq-longpoll.js: the browser client of polymq's long-polling frontend.
 *
 * An ES module with no dependencies, served by `polymq longpoll` at /polymq-longpoll.js
 * (no build step, no CDN):
 *
 *   import { PolymqLongpoll } from "http://127.0.0.1:7490/polymq-longpoll.js";
 *   const client = new PolymqLongpoll();            // the origin that served this file
 *   const sub = await client.subscribe("topic/news.#", {
 *     transport: "sse",                             // or "poll" (long polling)
 *     onMessage: (m) => console.log(m.body),        // in order; may return a promise
 *   });
 *   await client.publish("topic/news.sport", "goal");
 *   await sub.close();                              // and remove it from the core
 *
 * Options of the client: base (the frontend's URL), token (sent as a Bearer token) or
 * user + password (Basic), minDelay / maxDelay (ms between reconnect attempts).
 * Options of subscribe: transport, onMessage(message, sub), onStatus(status, sub),
 * onError(error, sub), autoAck (queues: ack each message once onMessage has returned,
 * nack it if it threw; default true), wait (long-poll seconds, default 25), max, and the
 * subscription's own: offset (streams), ttl, visibility (queues), buffer (topics), ack
 * ("client" or "auto"), prefetch.
 *
 * Reconnects: the subscription lives in polymq's core, so any replica serves it. A lost
 * connection is retried with backoff from the last cursor received (sent as Last-Event-ID),
 * for topics and streams nothing is lost or seen twice; queue messages not acked in time
 * come back. SSE uses the browser's EventSource when no credentials are needed, else (and
 * after EventSource gives up on an HTTP error, to learn which) a fetch() stream reader.
 * An unknown or expired subscription (404) or cursor (410) is final: status "failed".
 */

const FATAL = new Set([400, 401, 403, 404, 405, 409, 410, 413, 415]);

export class PolymqError extends Error {
  constructor(status, problem) {
    super((problem && problem.detail) || `HTTP ${status}`);
    this.name = "PolymqError";
    this.status = status;
    this.problem = problem || null;
    this.code = (problem && problem.code) || null;
  }

  /** An error that retrying cannot fix (bad input, no permission, subscription gone). */
  get fatal() {
    return FATAL.has(this.status);
  }

  static async from(response) {
    let problem = null;
    try {
      problem = await response.json();
    } catch (_) {
      /* not a problem document */
    }
    return new PolymqError(response.status, problem);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function basic(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  return "Basic " + btoa(String.fromCharCode(...bytes));
}

function destinationPath(destination) {
  const i = destination.indexOf("/");
  if (i < 1) throw new TypeError(`destination ${destination} must be like "queue/name"`);
  return `${destination.slice(0, i)}/${encodeURIComponent(destination.slice(i + 1))}`;
}

export class PolymqLongpoll {
  constructor(options = {}) {
    const base = options.base ?? new URL(import.meta.url).origin;
    this.base = String(base).replace(/\/+$/, "");
    this.authorization = options.token
      ? `Bearer ${options.token}`
      : options.user != null
        ? basic(options.user, options.password ?? "")
        : null;
    this.minDelay = options.minDelay ?? 250;
    this.maxDelay = options.maxDelay ?? 5000;
  }

  headers(extra = {}) {
    const out = { ...extra };
    if (this.authorization) out.Authorization = this.authorization;
    return out;
  }

  async request(method, path, body, { signal } = {}) {
    const init = { method, headers: this.headers(), cache: "no-store", signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(this.base + path, init);
    if (!response.ok) throw await PolymqError.from(response);
    return response.status === 204 ? null : response.json();
  }

  /** Open a subscription at the core and start receiving: a started Subscription. */
  async subscribe(destination, options = {}) {
    const spec = { destination };
    for (const key of ["offset", "ttl", "visibility", "buffer", "ack", "prefetch"]) {
      if (options[key] !== undefined) spec[key] = options[key];
    }
    const info = await this.request("POST", "/v1/subscriptions", spec);
    const sub = new Subscription(this, info, options, false);
    sub.start();
    return sub;
  }

  /** Resume a subscription opened earlier (e.g. saved from sub.info() across a reload). */
  attach(info, options = {}) {
    const sub = new Subscription(this, info, options, true);
    sub.start();
    return sub;
  }

  /** Publish one message: body is a string (utf8) or bytes (Uint8Array, sent as base64);
   * fields are the JSON over HTTP ones (content_type, headers, priority, persistent, ...). */
  publish(destination, body, fields = {}) {
    const message = { ...fields };
    if (body instanceof Uint8Array) {
      message.body = btoa(String.fromCharCode(...body));
      message.encoding = "base64";
    } else {
      message.body = String(body);
    }
    return this.request("POST", `/v1/${destinationPath(destination)}/messages`, message);
  }

  ack(receipts) {
    return this.request("POST", "/v1/ack", { receipts });
  }

  nack(receipts, { requeue = true } = {}) {
    return this.request("POST", "/v1/nack", { receipts, requeue });
  }

  delay(failures) {
    const ms = Math.min(this.maxDelay, this.minDelay * 2 ** Math.min(failures, 16));
    return ms * (0.5 + Math.random() / 2);
  }
}

export class Subscription {
  constructor(client, info, options, resuming) {
    this.client = client;
    this.id = info.id;
    this.destination = info.destination;
    this.kind = info.destination.split("/", 1)[0];
    this.cursor = info.cursor ?? null; // resume from here: the last message received
    this.transport = options.transport ?? "sse";
    if (this.transport !== "sse" && this.transport !== "poll") {
      throw new TypeError('transport must be "sse" or "poll"');
    }
    this.wait = options.wait ?? 25;
    this.max = options.max ?? null;
    this.autoAck = options.autoAck ?? true;
    this.onMessage = options.onMessage ?? (() => {});
    this.onStatus = options.onStatus ?? (() => {});
    this.onError = options.onError ?? ((error) => console.warn("polymq:", error));
    this.status = "connecting";
    this.closed = false;
    this.received = 0; // messages handed to onMessage
    this.reconnects = 0; // connections resumed from a cursor after one was lost
    this._resuming = resuming; // the next connection says where to resume (Last-Event-ID)
    this._failures = 0;
    this._abort = null;
    this._source = null;
    this._useFetch = client.authorization !== null || typeof EventSource === "undefined";
    this._chain = Promise.resolve();
    this._settle = { ack: [], nack: [] };
    this._settleTimer = null;
  }

  info() {
    return { id: this.id, destination: this.destination, cursor: this.cursor };
  }

  start() {
    if (this.transport === "poll") this._pollLoop();
    else this._sse();
  }

  async close({ keep = false } = {}) {
    if (this.closed) return;
    this.closed = true;
    if (this._abort) this._abort.abort();
    if (this._source) this._source.close();
    this._setStatus("closed");
    await this._flushSettle();
    if (!keep) {
      try {
        await this.client.request("DELETE", `/v1/subscriptions/${this.id}`);
      } catch (_) {
        /* gone already */
      }
    }
  }

  // ---- delivery ---------------------------------------------------------------------------
  async _deliver(message) {
    if (this.closed) return;
    let ok = true;
    try {
      await this.onMessage(message, this);
    } catch (error) {
      ok = false;
      this.onError(error, this);
    }
    this.received += 1;
    if (message.receipt && this.autoAck) {
      this._settle[ok ? "ack" : "nack"].push(message.receipt);
      if (this._settleTimer === null) this._settleTimer = setTimeout(() => this._flushSettle(), 0);
    }
  }

  _queue(message) {
    this._chain = this._chain.then(() => this._deliver(message));
  }

  async _flushSettle() {
    clearTimeout(this._settleTimer);
    this._settleTimer = null;
    for (const action of ["ack", "nack"]) {
      const receipts = this._settle[action].splice(0);
      for (let attempt = 0; receipts.length && attempt < 5; attempt += 1) {
        try {
          await this.client[action](receipts);
          break;
        } catch (error) {
          if (error instanceof PolymqError && error.fatal) break; // leases expired: redelivered
          await sleep(this.client.delay(attempt));
        }
      }
    }
  }

  // ---- connection state -------------------------------------------------------------------
  _setStatus(status, error) {
    if (this.status === status) return;
    this.status = status;
    this.onStatus(status, this, error);
  }

  _connected() {
    if (this._resuming) this.reconnects += 1;
    this._resuming = false;
    this._failures = 0;
    this._setStatus("connected");
  }

  async _lost(error) {
    this._resuming = true;
    this._setStatus("reconnecting", error);
    await sleep(this.client.delay(this._failures));
    this._failures += 1;
  }

  _fail(error) {
    this.closed = true;
    if (this._source) this._source.close();
    this._setStatus("failed", error);
    this.onError(error, this);
  }

  _url(what, params) {
    const query = params.toString();
    return `${this.client.base}/v1/subscriptions/${this.id}/${what}${query ? "?" + query : ""}`;
  }

  // ---- long polling -------------------------------------------------------------------------
  async _pollLoop() {
    let first = !this._resuming;
    while (!this.closed) {
      // the first poll after (re)connecting answers at once: it says the link is up
      const wait = this.status === "connected" ? this.wait : 0;
      const params = new URLSearchParams({ wait: String(wait) });
      if (this.max) params.set("max", String(this.max));
      const headers = {};
      if (this._resuming && this.cursor !== null) headers["Last-Event-ID"] = this.cursor;
      else if (!first && this.cursor !== null) params.set("cursor", this.cursor);
      try {
        this._abort = new AbortController();
        const response = await fetch(this._url("poll", params), {
          headers: this.client.headers(headers),
          signal: this._abort.signal,
          cache: "no-store",
        });
        if (!response.ok) throw await PolymqError.from(response);
        const answer = await response.json();
        this._connected();
        first = false;
        for (const message of answer.messages) await this._deliver(message);
        if (answer.cursor !== null) this.cursor = answer.cursor;
      } catch (error) {
        if (this.closed) return;
        if (error instanceof PolymqError && error.fatal) return this._fail(error);
        await this._lost(error);
      }
    }
  }

  // ---- Server-Sent Events -------------------------------------------------------------------
  _sse() {
    if (this._useFetch) {
      this._sseFetch();
      return;
    }
    const params = new URLSearchParams();
    if (this.max) params.set("max", String(this.max));
    if (this._resuming && this.cursor !== null) params.set("cursor", this.cursor);
    const source = new EventSource(this._url("events", params));
    this._source = source;
    source.onopen = () => this._connected();
    source.onmessage = (event) => this._received(event.data);
    source.addEventListener("problem", (event) => {
      source.close();
      this._problem(JSON.parse(event.data));
    });
    source.onerror = () => {
      if (this.closed || source !== this._source) return;
      if (source.readyState === EventSource.CLOSED) {
        // an HTTP error: EventSource will not say which; ask again with fetch, which can
        this._useFetch = true;
        this._lost(new Error("the event stream was refused")).then(() => this._sse());
      } else {
        this._resuming = true; // the browser reconnects by itself, with Last-Event-ID
        this._setStatus("reconnecting");
      }
    };
  }

  _received(data) {
    const message = JSON.parse(data);
    if (message.cursor != null && this.kind !== "queue") this.cursor = message.cursor;
    this._queue(message);
  }

  _problem(problem) {
    const error = new PolymqError(problem.status, problem);
    this._source = null;
    if (error.fatal) {
      this._fail(error);
    } else {
      this._lost(error).then(() => this.closed || this._sse());
    }
  }

  async _sseFetch() {
    let first = !this._resuming;
    while (!this.closed) {
      const params = new URLSearchParams();
      if (this.max) params.set("max", String(this.max));
      const headers = { Accept: "text/event-stream" };
      if (!first && this.cursor !== null) headers["Last-Event-ID"] = this.cursor;
      try {
        this._abort = new AbortController();
        const response = await fetch(this._url("events", params), {
          headers: this.client.headers(headers),
          signal: this._abort.signal,
          cache: "no-store",
        });
        if (!response.ok) throw await PolymqError.from(response);
        this._connected();
        first = false;
        const retry = await this._readEvents(response.body);
        if (this.closed) return;
        this._resuming = true; // the stream ended (the server is stopping): resume elsewhere
        this._setStatus("reconnecting");
        await sleep(retry);
      } catch (error) {
        if (this.closed) return;
        first = false;
        if (error instanceof PolymqError && error.fatal) return this._fail(error);
        await this._lost(error);
      }
    }
  }

  /** Read an event stream until it ends; the reconnect delay it asked for (ms). */
  async _readEvents(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let data = [];
    let event = "";
    let retry = 1000;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return retry;
      buffer += value;
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (data.length && event === "problem") {
            const problem = JSON.parse(data.join("\n"));
            throw new PolymqError(problem.status, problem);
          }
          if (data.length && (event === "" || event === "message")) this._received(data.join("\n"));
          data = [];
          event = "";
          continue;
        }
        if (line.startsWith(":")) continue; // a keep-alive comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "data") data.push(text);
        else if (field === "event") event = text;
        else if (field === "retry" && /^\d+$/.test(text)) retry = Number(text);
        // "id" is in each message as its cursor
      }
    }
  }
}

globalThis.PolymqLongpoll = PolymqLongpoll;
