"use strict";
// Shared login sessions, the same state as Python's captcha_tasks/toolkit/sessions.py: one
// domain's cookies (a hash with a TTL plus a version counter) and its session lock, changed
// only through the package's Lua scripts (sessions/save_cookies, sessions/lock_*).
const crypto = require("crypto");
const check = require("./check");
const { SessionBusy } = require("./errors");

/** A session lock's default TTL (ms): Python's toolkit/sessions.py LOCK_TTL_MS. */
const LOCK_TTL_MS = 3000;
const DEFAULT_COOKIE_TTL_S = 3600;

/** name -> value, with the store `version` they were read at (a non-enumerable property,
 * so the object is plain in JSON and in spreading). */
function withVersion(cookies, version) {
  Object.defineProperty(cookies, "version", { value: version, enumerable: false });
  return cookies;
}

class CookieStore {
  constructor(ct, { ttl = DEFAULT_COOKIE_TTL_S } = {}) {
    this._ct = ct;
    this._ttlMs = Math.max(1, Math.round(check.positiveNumber(ttl, "ttl") * 1000));
  }

  /** The domain's cookies ({} when none or expired), with `.version`. */
  async load(domain) {
    const host = check.domain(domain);
    const k = this._ct.keys;
    const [[, raw], [, version]] = await this._ct._guard(
      this._ct.redis.multi().hgetall(k.cookies(host)).get(k.sessionVersion(host)).exec(),
      "loading cookies",
    );
    return withVersion({ ...raw }, Number(version || 0));
  }

  /** Replace the domain's cookies at once; returns the new version. */
  async save(domain, cookies, options) {
    const host = check.domain(domain);
    const clean = check.cookies(cookies);
    const { ttl } = check.options(options, "options");
    const ttlMs = ttl === undefined ? this._ttlMs : Math.max(1, Math.round(check.positiveNumber(ttl, "options.ttl") * 1000));
    const k = this._ct.keys;
    const keys = { cookies: k.cookies(host), version: k.sessionVersion(host) };
    return Number(await this._ct._run("sessions/save_cookies", keys, { cookies: clean, ttl_ms: ttlMs }, "saving cookies"));
  }

  /** How many times the domain's cookies were saved (0: never). */
  async version(domain) {
    const key = this._ct.keys.sessionVersion(check.domain(domain));
    return Number((await this._ct._guard(this._ct.redis.get(key), "reading a cookie version")) || 0);
  }

  /** Drop the cookies; the version stays (nobody produced a newer session). */
  async clear(domain) {
    const key = this._ct.keys.cookies(check.domain(domain));
    await this._ct._guard(this._ct.redis.del(key), "clearing cookies");
  }
}

/** A per-domain lock with a short TTL, extended or released only by its holder (its
 * random token is compared in Lua).  Acquiring never waits. */
class SessionLock {
  constructor(ct, domain, { ttlMs = LOCK_TTL_MS } = {}) {
    this.domain = check.domain(domain);
    this.ttlMs = check.positiveInt(ttlMs, "ttlMs");
    this._ct = ct;
    this._key = ct.keys.sessionLock(this.domain);
    this._token = null;
  }

  get held() {
    return this._token !== null;
  }

  /** Take the lock if nobody holds it: true, else false. */
  async acquire() {
    const token = crypto.randomBytes(16).toString("hex");
    const taken = await this._ct._run("sessions/lock_acquire", { lock: this._key }, { token, ttl_ms: this.ttlMs }, "taking a session lock");
    this._token = Number(taken) === 1 ? token : null;
    return this._token !== null;
  }

  /** Reset the TTL if the lock is still ours (false when it expired meanwhile). */
  async extend(ttlMs) {
    const ttl = ttlMs === undefined ? this.ttlMs : check.positiveInt(ttlMs, "ttlMs");
    if (this._token === null) return false;
    const done = await this._ct._run("sessions/lock_extend", { lock: this._key }, { token: this._token, ttl_ms: ttl }, "extending a session lock");
    return Number(done) === 1;
  }

  /** Delete the lock if it still holds our token. */
  async release() {
    const token = this._token;
    this._token = null;
    if (token === null) return false;
    return Number(await this._ct._run("sessions/lock_release", { lock: this._key }, { token }, "releasing a session lock")) === 1;
  }

  /** Run `fn` holding the lock, extended every third of its TTL; SessionBusy when another
   * holder has it. */
  async with(fn) {
    if (!(await this.acquire())) throw new SessionBusy(`session lock for ${this.domain} is held by another worker`);
    const beat = setInterval(() => this.extend().catch(() => {}), Math.max(1, Math.floor(this.ttlMs / 3)));
    try {
      return await fn(this);
    } finally {
      clearInterval(beat);
      await this.release();
    }
  }

  toJSON() {
    return { domain: this.domain, ttlMs: this.ttlMs, held: this.held }; // never the token
  }
}

module.exports = { CookieStore, SessionLock, LOCK_TTL_MS, withVersion };
