"use strict";
// Where Redis is and which key prefix: REDIS_URL and CAPTCHAAI_KEY_PREFIX, as the Python
// package reads them (captcha_tasks/settings.py), sentinel:// URLs included.
const { ConfigurationError } = require("./errors");

const DEFAULT_URL = "redis://localhost:6379/0";
const DEFAULT_PREFIX = "captcha";
const DEFAULT_SENTINEL_PORT = 26379;
const WHY = "must be sentinel://[:password@]host:port[/db] parts joined by ';'";

/** An ioredis options object for `url` (redis://, rediss://, or sentinel://...;...). */
function redisOptions(url, env = process.env) {
  if (!url.startsWith("sentinel://")) return { url };
  const parts = url.split(";").filter((chunk) => chunk.trim()).map(sentinelPart);
  if (!parts.length) throw new ConfigurationError("REDIS_URL names no sentinel");
  const passwords = new Set(parts.filter((p) => p.password).map((p) => decodeURIComponent(p.password)));
  if (passwords.size > 1) throw new ConfigurationError("REDIS_URL gives different passwords to its sentinel:// parts");
  const dbs = new Set(parts.filter((p) => p.pathname.replace(/\//g, "")).map(sentinelDb));
  if (dbs.size > 1) throw new ConfigurationError("REDIS_URL gives different databases to its sentinel:// parts");
  const master = (env.REDIS_SENTINEL_MASTER || "").trim();
  if (!master) {
    throw new ConfigurationError("REDIS_SENTINEL_MASTER must name the master when REDIS_URL is a sentinel:// URL");
  }
  const options = {
    sentinels: parts.map((p) => ({ host: p.hostname, port: Number(p.port) || DEFAULT_SENTINEL_PORT })),
    name: master,
    db: dbs.size ? [...dbs][0] : 0,
  };
  if (passwords.size) options.password = [...passwords][0];
  if (env.REDIS_SENTINEL_PASSWORD) options.sentinelPassword = env.REDIS_SENTINEL_PASSWORD;
  if (["1", "true", "yes"].includes((env.REDIS_SENTINEL_TLS || "").toLowerCase())) {
    options.tls = {};
    options.sentinelTLS = {};
    options.enableTLSForSentinelMode = true;
  }
  return { sentinel: options };
}

function sentinelPart(chunk) {
  let parts;
  try {
    parts = new URL(chunk.trim());
  } catch {
    throw new ConfigurationError(`REDIS_URL ${WHY}`);
  }
  if (parts.protocol !== "sentinel:" || !parts.hostname) throw new ConfigurationError(`REDIS_URL ${WHY}`);
  if (parts.search || parts.hash) {
    throw new ConfigurationError("REDIS_URL takes no options in a sentinel:// URL (use the REDIS_SENTINEL_* settings)");
  }
  if (parts.username) {
    throw new ConfigurationError("REDIS_URL takes a password only in a sentinel:// URL (sentinel://:password@host), no user");
  }
  return parts;
}

function sentinelDb(parts) {
  const raw = parts.pathname.replace(/\//g, "");
  if (!/^\d+$/.test(raw)) throw new ConfigurationError("REDIS_URL must name its database as /<number> (or not at all)");
  return Number(raw);
}

/** `url` with its password shown as ***: safe for messages. */
function maskUrl(url) {
  if (url.includes(";")) return url.split(";").map(maskUrl).join(";");
  return url.replace(/^([a-z]+:\/\/[^:@/]*:)[^@/]*@/i, "$1***@");
}

module.exports = { DEFAULT_URL, DEFAULT_PREFIX, redisOptions, maskUrl };
