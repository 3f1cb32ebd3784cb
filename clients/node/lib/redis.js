"use strict";
// One ioredis client per CaptchaTasks, and the translation of its failures into the
// package's errors at this boundary: Redis unreachable -> StoreUnavailable (retry later).
const Redis = require("ioredis");
const { StoreUnavailable, InternalError } = require("./errors");
const { maskUrl, redisOptions } = require("./settings");

/** Reconnects back off up to this many ms (ioredis retries forever). */
const MAX_BACKOFF_MS = 500;

function connect(url, { connectTimeoutMs = 2000, env = process.env } = {}) {
  const { url: plain, sentinel } = redisOptions(url, env);
  const common = {
    lazyConnect: true,
    connectTimeout: connectTimeoutMs,
    // A command fails fast while Redis is down (StoreUnavailable) instead of queueing for
    // minutes; the connection keeps trying in the background.
    maxRetriesPerRequest: 1,
    retryStrategy: (times) => Math.min(times * 50, MAX_BACKOFF_MS),
    // A take or a save whose reply was lost must never be sent a second time.
    autoResendUnfulfilledCommands: false,
  };
  const client = sentinel ? new Redis({ ...sentinel, ...common }) : new Redis(plain, common);
  // Without a listener ioredis prints every failed reconnect; callers get typed errors.
  client.on("error", () => {});
  return client;
}

const UNREACHABLE = [
  "MaxRetriesPerRequestError",
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EPIPE",
  "Connection is closed",
  "Stream isn't writeable",
  "connect ETIMEDOUT",
  "All sentinels are unreachable",
  "LOADING",
];

/** `promise` with Redis's failures as the package's errors (`what`: what was being done). */
async function guard(promise, url, what) {
  try {
    return await promise;
  } catch (err) {
    throw translate(err, url, what);
  }
}

function translate(err, url, what) {
  if (err && err.code && /^ERROR_|^IP_BANNED|^MAX_USER_TURN/.test(err.code)) return err; // ours already
  const text = `${(err && err.name) || ""} ${(err && err.code) || ""} ${(err && err.message) || ""}`;
  if (UNREACHABLE.some((mark) => text.includes(mark))) {
    return new StoreUnavailable(`${what}: Redis at ${maskUrl(url)} is unreachable`, null, null, { cause: err });
  }
  return new InternalError(`${what}: Redis answered ${(err && err.name) || "an error"}`, null, null, { cause: err });
}

module.exports = { connect, guard, translate };
