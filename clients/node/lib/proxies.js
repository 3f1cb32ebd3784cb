"use strict";
// Proxy leases, the same state as Python's captcha_tasks/state/proxies.py (ProxyLeases):
// an owner keeps its proxy while alive; proxies/acquire and proxies/release do the change.
const crypto = require("crypto");
const check = require("./check");
const { badArgument } = require("./errors");

/** Free-looking proxies offered to one call of proxies/acquire (its 12 keys' share). */
const CANDIDATES = 8;
const ACQUIRE_TRIES = 3;
const DEFAULT_TTL_S = 600;

/** The short id of a (canonical, as the pool stores it) proxy in key names. */
function proxyId(proxy) {
  return crypto.createHash("sha1").update(proxy, "utf8").digest("hex").slice(0, 16);
}

function owner(value) {
  if (typeof value !== "string" || !value || value.length > 200 || /\s/.test(value)) {
    throw badArgument("owner", "a non-empty string of at most 200 characters without whitespace");
  }
  return value;
}

function shuffle(items) {
  for (let i = items.length - 1; i > 0; i -= 1) {
    const j = Math.floor(Math.random() * (i + 1));
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}

class ProxyLeases {
  constructor(ct, { ttl = DEFAULT_TTL_S } = {}) {
    this._ct = ct;
    this._ttlMs = Math.max(1, Math.round(check.positiveNumber(ttl, "ttl") * 1000));
  }

  _ownerKey(proxy) {
    return this._ct.keys.proxyOwner(proxyId(proxy));
  }

  /** The owner's live proxy (its TTL refreshed), else a free one, else null. */
  async lease(who) {
    const name = owner(who);
    for (let i = 0; i < ACQUIRE_TRIES; i += 1) {
      const found = await this._tryLease(name);
      if (found !== "again") return found;
    }
    return null; // the owner's assignment kept changing: another lease won
  }

  async _tryLease(name) {
    const k = this._ct.keys;
    const [[, current], [, members]] = await this._ct._guard(
      this._ct.redis.pipeline().get(k.proxyAssignment(name)).smembers(k.proxies()).exec(),
      "reading the proxy pool",
    );
    const pool = await this._free(shuffle(members));
    const keys = {
      proxies: k.proxies(),
      quarantine: k.proxyQuarantine(),
      assignment: k.proxyAssignment(name),
      current_owner: current ? this._ownerKey(current) : k.proxyOwner("-"),
    };
    const args = { ttl_ms: this._ttlMs, owner: name };
    if (current) args.current = current;
    for (let start = 0; start < Math.max(1, pool.length); start += CANDIDATES) {
      const reply = await this._offer(keys, args, pool.slice(start, start + CANDIDATES));
      if (reply === "again") return "again";
      if (reply) return reply[0];
      delete args.current; // dead: the first call dropped it
      keys.current_owner = k.proxyOwner("-");
    }
    return null;
  }

  async _free(pool) {
    if (pool.length <= CANDIDATES) return pool;
    const held = await this._ct._guard(this._ct.redis.mget(pool.map((p) => this._ownerKey(p))), "reading proxy owners");
    return pool.filter((_, i) => held[i] === null);
  }

  async _offer(keys, args, chunk) {
    const all = { ...keys, owners: chunk.map((p) => this._ownerKey(p)) };
    return this._ct._run("proxies/acquire", all, { ...args, candidates: chunk }, "leasing a proxy");
  }

  /** Free the owner's proxy; false when it holds none. */
  async release(who) {
    const name = owner(who);
    const k = this._ct.keys;
    const proxy = await this._ct._guard(this._ct.redis.get(k.proxyAssignment(name)), "reading a proxy lease");
    if (proxy === null) return false;
    const keys = { assignment: k.proxyAssignment(name), owner: this._ownerKey(proxy) };
    return Number(await this._ct._run("proxies/release", keys, { owner: name, proxy }, "releasing a proxy")) === 1;
  }

  /** The proxy assigned to the owner now (not refreshed), or null. */
  async current(who) {
    return this._ct._guard(this._ct.redis.get(this._ct.keys.proxyAssignment(owner(who))), "reading a proxy lease");
  }
}

module.exports = { ProxyLeases, proxyId, CANDIDATES };
