"use strict";
// CaptchaTasks: the Node.js client of a captcha-tasks deployment's Redis, named like the
// Python toolkit (take_token -> takeToken, CookieStore -> cookies, SessionLock ->
// sessionLock, ProxyLeases -> proxies).  Every change to shared state runs the Python
// package's own Lua scripts, so both languages share ONE implementation of it.
const check = require("./check");
const errors = require("./errors");
const { ReplicaFence, replicaFence } = require("./fence");
const gateway = require("./gateway");
const { Keys } = require("./keys");
const { ProxyLeases } = require("./proxies");
const { connect, guard } = require("./redis");
const { Library, bind } = require("./scripts");
const { CookieStore, SessionLock } = require("./sessions");
const { DEFAULT_PREFIX, DEFAULT_URL, maskUrl } = require("./settings");

/** The scripts this client runs (registered once per client). */
const SCRIPTS = [
  "pools/take",
  "sessions/save_cookies",
  "sessions/lock_acquire",
  "sessions/lock_extend",
  "sessions/lock_release",
  "proxies/acquire",
  "proxies/release",
];
/** Seconds of take history the pool keeps (Python's state/pools.py TAKE_HISTORY_S). */
const TAKE_HISTORY_S = 600;

function stringOption(value, name, fallback) {
  if (value === undefined) return fallback;
  return check.nonEmptyString(value, name);
}

class CaptchaTasks {
  /** `redisUrl` (default REDIS_URL), `keyPrefix` (default CAPTCHAAI_KEY_PREFIX or
   * "captcha"), `cookieTtl` (s), `proxyTtl` (s), `env` (default process.env). */
  constructor(options) {
    const o = check.options(options, "options");
    const env = o.env === undefined ? process.env : check.options(o.env, "options.env");
    this.redisUrl = stringOption(o.redisUrl, "options.redisUrl", env.REDIS_URL || DEFAULT_URL);
    this.keys = new Keys(stringOption(o.keyPrefix, "options.keyPrefix", env.CAPTCHAAI_KEY_PREFIX || DEFAULT_PREFIX));
    this.redis = connect(this.redisUrl, { env });
    /** Behind Sentinel: takes are delivered only once a replica holds them (./fence.js). */
    this._fence = replicaFence(this.redisUrl, env);
    this._runScript = bind(this.redis, new Library(o.luaRoot), SCRIPTS);
    this.cookies = new CookieStore(this, { ttl: o.cookieTtl });
    this.proxies = new ProxyLeases(this, { ttl: o.proxyTtl });
  }

  /** The Redis URL, password masked (safe to log). */
  toString() {
    return `CaptchaTasks(${maskUrl(this.redisUrl)}, prefix=${this.keys.prefix})`;
  }

  toJSON() {
    return { redisUrl: maskUrl(this.redisUrl), keyPrefix: this.keys.prefix };
  }

  /** Take one pooled token, or null when the pool has none usable.  The token object has
   * the shape of Python's take_token: status, captcha_id, method, source "pool",
   * elapsed_s, solved_at, expires_at (ISO 8601), remaining_s, token last. */
  async takeToken(pool, options) {
    const name = check.poolName(pool);
    const { minRemaining } = check.options(options, "options");
    const args = { name, history_s: TAKE_HISTORY_S };
    if (minRemaining !== undefined) args.min_s = check.nonNegative(minRemaining, "options.minRemaining");
    const started = Date.now();
    const k = this.keys;
    const keys = { registry: k.poolRegistry(), tokens: k.poolTokens(name), stats: k.poolStats(name), takes: k.poolTakes(name) };
    const [reply, held] = await this._guard(this._fenced("pools/take", keys, args), `taking a token from pool ${name}`);
    const token = takeReply(reply, name, started);
    // Behind Sentinel, a take no replica holds may be lost with its master, and the token
    // handed out again from the new one: never deliver it (a miss), as Python's take().
    return held ? token : null;
  }

  /** A lock on `domain`'s shared session (`ttlMs`: default 3000, Python's LOCK_TTL_MS). */
  sessionLock(domain, options) {
    return new SessionLock(this, domain, check.options(options, "options"));
  }

  /** Solve through a gateway speaking the 2captcha in.php/res.php protocol:
   * task {method, sitekey, pageurl, lane, tenant, params}, options {gateway, key}. */
  solve(task, options) {
    return gateway.solve(task, options);
  }

  async close() {
    if (this._fence) this._fence.close();
    if (this.redis.status === "end") return;
    try {
      await this.redis.quit();
    } catch {
      this.redis.disconnect();
    }
  }

  // -- internals: every Redis call goes through these two -----------------------------
  _guard(promise, what) {
    return guard(promise, this.redisUrl, what);
  }

  _run(name, keys, args, what = name) {
    return this._guard(this._runScript(name, keys, args), what);
  }

  /** Run a script and say whether a replica holds what it wrote: [reply, held], held
   * also true when no replica could take over (Python's Db.fenced).  Unguarded. */
  async _fenced(name, keys, args) {
    if (!this._fence || !(await this._fence.needed())) return [await this._runScript(name, keys, args), true];
    const { sha, source, argv } = this._runScript.parts(name, keys, args);
    try {
      return await this._thenWait(["EVALSHA", sha, ...argv]);
    } catch (err) {
      // NOSCRIPT: the script did not run, so sending it whole is no second take.  (ioredis's
      // own fallback would send it after the WAIT, which would then check nothing.)
      if (!String(err && err.message).startsWith("NOSCRIPT")) throw err;
      return this._thenWait(["EVAL", source, ...argv]);
    }
  }

  /** `command` then WAIT on its connection (one pipeline): [reply, acknowledged >= 1]. */
  async _thenWait(command) {
    const [[failed, reply], [waitFailed, acknowledged]] = await this.redis
      .pipeline()
      .call(...command)
      .call(...ReplicaFence.waitCommand())
      .exec();
    if (failed) throw failed;
    if (waitFailed) throw waitFailed;
    return [reply, Number(acknowledged) >= 1];
  }
}

function takeReply(reply, name, started) {
  const status = Number(reply[0]);
  if (status < 0) throw new errors.PoolNotFound(`pool '${name}' is not declared`);
  if (status === 0) return null;
  const record = JSON.parse(reply[1]);
  const remaining = Number(reply[2]) / 1000;
  const now = Date.now();
  const token = {
    status: "solved",
    captcha_id: String(record.captcha_id),
    method: record.method,
    source: "pool",
    elapsed_s: Math.round(now - started) / 1000,
    solved_at: record.solved_at,
    expires_at: new Date(now + remaining * 1000).toISOString(),
  };
  if (record.user_agent) token.user_agent = record.user_agent;
  if (record.provider) token.provider = record.provider;
  return { ...token, remaining_s: remaining, token: record.token };
}

module.exports = { CaptchaTasks, SCRIPTS, TAKE_HISTORY_S };
