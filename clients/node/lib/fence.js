"use strict";
// The replica fence of a sentinel:// deployment, as the Python package's
// captcha_tasks/state/connections.py ReplicaFence: a take is delivered only once a replica
// holds it (WAIT 1 <ms> queued after it, on its connection), or when the sentinels know
// of no replica that could be promoted.  Behind Sentinel a write the old master took after
// a replica was promoted is lost: a take no replica holds could see its token handed out
// again from the new master, so it is never delivered (a miss).
const Redis = require("ioredis");
const { redisOptions } = require("./settings");

/** Seconds between two looks at the sentinels (Python's connections.FOLLOW_S). */
const FOLLOW_S = 0.5;
/** Seconds after a master move is seen during which every take waits for a replica
 * whatever the replicas are (Python's connections.MOVE_SETTLE_S). */
const MOVE_SETTLE_S = 4 * FOLLOW_S;
/** Milliseconds a fenced take waits for a replica's acknowledgement (FENCE_WAIT_MS). */
const FENCE_WAIT_MS = 500;
/** Seconds to wait for a sentinel's connection or reply (SENTINEL_TIMEOUT_S): a dead one
 * is skipped for the next. */
const SENTINEL_TIMEOUT_S = 2;
/** Flags of a replica the sentinels could not promote now (_NOT_A_CANDIDATE). */
const NOT_A_CANDIDATE = ["s_down", "o_down"];

class ReplicaFence {
  /** `sentinel`: the ioredis sentinel options settings.redisOptions built (sentinels, name,
   * sentinelPassword, sentinelTLS). */
  constructor(sentinel, { clock = () => performance.now() / 1000 } = {}) {
    this._master = sentinel.name;
    this._clock = clock;
    this._sentinels = sentinel.sentinels.map(
      (where) =>
        new Redis({
          host: where.host,
          port: where.port,
          password: sentinel.sentinelPassword,
          tls: sentinel.enableTLSForSentinelMode ? sentinel.sentinelTLS : undefined,
          lazyConnect: true,
          connectTimeout: SENTINEL_TIMEOUT_S * 1000,
          commandTimeout: SENTINEL_TIMEOUT_S * 1000,
          maxRetriesPerRequest: 0,
          enableOfflineQueue: true,
          retryStrategy: (times) => Math.min(times * 50, 500),
        }),
    );
    for (const client of this._sentinels) client.on("error", () => {});
    this._needed = true;
    this._nextLook = 0;
    this._address = null;
    this._movedAt = -Infinity;
  }

  /** Whether a replica that could be promoted exists (true when no sentinel says).  The
   * sentinels are asked at most every FOLLOW_S; takes meanwhile use the last answer. */
  async needed() {
    const now = this._clock();
    if (now < this._nextLook) return this._needed;
    this._nextLook = now + FOLLOW_S;
    this._needed = await this._look(now);
    return this._needed;
  }

  async _look(now) {
    for (const sentinel of this._sentinels) {
      let master;
      let replicas;
      try {
        master = fields(await sentinel.call("SENTINEL", "master", this._master));
        replicas = (await sentinel.call("SENTINEL", "replicas", this._master)).map(fields);
      } catch {
        continue; // down, timed out, or does not know the master: ask the next one
      }
      const address = `${master.ip}:${Number(master.port || 0)}`;
      if (this._address !== null && address !== this._address) this._movedAt = now;
      this._address = address;
      const settling = now - this._movedAt < MOVE_SETTLE_S;
      return settling || replicas.some(candidate);
    }
    return true; // no sentinel answers: assume a replica could take over
  }

  /** `WAIT 1 <ms>`: queued after the write, on its connection (a pipeline). */
  static waitCommand() {
    return ["WAIT", 1, FENCE_WAIT_MS];
  }

  close() {
    for (const client of this._sentinels) client.disconnect();
  }
}

/** A sentinel's flat reply (name, value, ...) as an object. */
function fields(flat) {
  const out = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[String(flat[i])] = String(flat[i + 1]);
  return out;
}

/** Whether the sentinels could promote this replica now. */
function candidate(replica) {
  const flags = String(replica.flags || "").split(",");
  return !NOT_A_CANDIDATE.some((flag) => flags.includes(flag));
}

/** The fence of a sentinel:// URL, or null for one Redis (nothing to fail over to, and
 * WAIT would wait for replicas that do not exist). */
function replicaFence(url, env = process.env) {
  const { sentinel } = redisOptions(url, env);
  return sentinel ? new ReplicaFence(sentinel) : null;
}

module.exports = {
  FENCE_WAIT_MS,
  FOLLOW_S,
  MOVE_SETTLE_S,
  NOT_A_CANDIDATE,
  SENTINEL_TIMEOUT_S,
  ReplicaFence,
  candidate,
  replicaFence,
};
