"use strict";
// Shared sessions with Python: cookies saved by either side are read by the other with the
// same version; the session lock excludes across languages.
const test = require("node:test");
const assert = require("node:assert/strict");
const { SessionBusy, ValidationError } = require("..");
const { client, missing, prefix, py, pySpawn, waitFor } = require("./helpers");

const skip = missing("REDIS_URL", "CT_PYTHON");

test("cookies go both ways with their versions", { skip }, async () => {
  const p = prefix("cookies");
  const ct = client(p);
  try {
    assert.equal(await ct.cookies.version("shop.example"), 0);
    assert.equal(await py(p, ["cookies-save", "shop.example", JSON.stringify({ sid: "py-1", csrf: "x" }), "60"]), 1);
    const loaded = await ct.cookies.load("Shop.Example");
    assert.deepEqual({ ...loaded }, { sid: "py-1", csrf: "x" });
    assert.equal(loaded.version, 1);
    assert.equal(await ct.cookies.save("shop.example", { sid: "node-2" }, { ttl: 1800 }), 2);
    assert.deepEqual(await py(p, ["cookies-load", "shop.example"]), { cookies: { sid: "node-2" }, version: 2 });
    const ttl = await ct.redis.pttl(ct.keys.cookies("shop.example"));
    assert.ok(ttl > 1790000 && ttl <= 1800000, `ttl ${ttl}`);
    assert.equal(JSON.stringify(await ct.cookies.load("shop.example")), '{"sid":"node-2"}');
    await ct.cookies.clear("shop.example");
    const cleared = await ct.cookies.load("shop.example");
    assert.deepEqual({ ...cleared }, {});
    assert.equal(cleared.version, 2, "clearing keeps the version");
  } finally {
    await ct.close();
  }
});

test("bad cookies and domains are refused naming the argument, never the value", { skip }, async () => {
  const ct = client(prefix("bad-cookies"));
  try {
    const secret = "s3cr3t-value";
    await assert.rejects(ct.cookies.save("shop.example", { sid: 42, other: secret }), (err) => {
      assert.ok(err instanceof ValidationError);
      assert.match(err.message, /cookies\.sid/);
      assert.ok(!err.message.includes(secret));
      return true;
    });
    await assert.rejects(ct.cookies.save("shop.example", {}), /argument cookies/);
    await assert.rejects(ct.cookies.load("not a host"), /argument domain/);
    await assert.rejects(ct.cookies.save("shop.example", { sid: "x" }, { ttl: 0 }), /options\.ttl/);
  } finally {
    await ct.close();
  }
});

test("while Node holds the lock Python cannot take it; after release it can", { skip }, async () => {
  const p = prefix("lock-node");
  const ct = client(p);
  try {
    // A long TTL: the test is about exclusion, and Python takes a while to start.
    const lock = ct.sessionLock("shop.example", { ttlMs: 60000 });
    assert.equal(await lock.acquire(), true);
    assert.equal(await py(p, ["lock-try", "shop.example"]), false);
    assert.equal(await lock.extend(), true);
    assert.equal(await py(p, ["lock-try", "shop.example"]), false);
    assert.equal(await lock.release(), true);
    assert.equal(await py(p, ["lock-try", "shop.example"]), true);
    assert.equal(await lock.release(), false, "released twice: not ours any more");
    assert.equal(JSON.stringify(lock).includes("token"), false);
  } finally {
    await ct.close();
  }
});

test("while Python holds the lock Node cannot take it; after release it can", { skip }, async () => {
  const p = prefix("lock-py");
  const ct = client(p);
  const holder = pySpawn(p, ["lock-hold", "shop.example"]);
  try {
    await waitFor(() => holder.lines.includes("held"), "Python to hold the lock", 30000);
    const lock = ct.sessionLock("shop.example");
    assert.equal(await lock.acquire(), false);
    assert.equal(await lock.extend(), false, "a lock we never took cannot be extended");
    await assert.rejects(lock.with(async () => {}), SessionBusy);
    holder.child.stdin.end("release\n");
    assert.equal((await holder.done).pop(), true);
    assert.equal(await lock.with(async (held) => held.held), true);
    assert.equal(await ct.redis.exists(ct.keys.sessionLock("shop.example")), 0, "with() released it");
  } finally {
    holder.child.kill();
    await ct.close();
  }
});
