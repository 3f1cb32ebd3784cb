"use strict";
// The key names of captcha_tasks/state/keys.py that this client reads or writes, built the same
// way (a test compares every one with Python's, for a key prefix too).  No other module of
// this package writes a key string.

class Keys {
  constructor(prefix = "captcha") {
    this.prefix = prefix;
  }

  _k(...parts) {
    return [this.prefix, ...parts].join(":");
  }

  poolRegistry() {
    return this._k("pools");
  }
  poolTokens(name) {
    return this._k("pool", name, "tokens");
  }
  poolStats(name) {
    return this._k("pool", name, "stats");
  }
  poolTakes(name) {
    return this._k("pool", name, "takes");
  }
  cookies(domain) {
    return this._k("session", domain, "cookies");
  }
  sessionLock(domain) {
    return this._k("session", domain, "lock");
  }
  sessionVersion(domain) {
    return this._k("session", domain, "version");
  }
  proxies() {
    return this._k("proxies", "all");
  }
  proxyAssignment(owner) {
    return this._k("proxies", "assigned", owner);
  }
  proxyOwner(proxyId) {
    return this._k("proxies", "owner", proxyId);
  }
  proxyQuarantine() {
    return this._k("proxies", "quarantine");
  }
}

module.exports = { Keys };
