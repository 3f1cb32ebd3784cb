"use strict";
// Token pools shared with Python: Python fills (PoolStore.add, as a refill does), Node
// takes through the same pools/take script; a race of both languages hands every token
// out once.
const test = require("node:test");
const assert = require("node:assert/strict");
const { PoolNotFound, ValidationError } = require("..");
const { client, missing, nodeSpawn, prefix, py, pySpawn, waitFor } = require("./helpers");

const skip = missing("REDIS_URL", "CT_PYTHON");

test("Node takes what Python pooled, in take_token's shape, each token once", { skip }, async () => {
  const p = prefix("take");
  const ct = client(p);
  try {
    await py(p, ["declare", "login"]);
    assert.equal(await py(p, ["fill", "login", "3", "a"]), 3);
    const python = await py(p, ["take", "login"]);
    const node = await ct.takeToken("login");
    assert.deepEqual(Object.keys(node), Object.keys(python));
    assert.equal(node.source, "pool");
    assert.ok(node.remaining_s > 200 && node.remaining_s <= 250, `remaining_s ${node.remaining_s}`);
    assert.ok(Date.parse(node.expires_at) > Date.now());
    const last = await ct.takeToken("login");
    const taken = new Set([python.token, node.token, last.token]);
    assert.deepEqual([...taken].sort(), ["tok-a-0", "tok-a-1", "tok-a-2"]);
    assert.equal(await ct.takeToken("login"), null, "a dry pool is a miss (null)");
    assert.equal(await py(p, ["take", "login"]), null);
  } finally {
    await ct.close();
  }
});

test("a pool nobody declared is PoolNotFound; a bad argument names itself", { skip }, async () => {
  const ct = client(prefix("undeclared"));
  try {
    await assert.rejects(ct.takeToken("nope"), PoolNotFound);
    await assert.rejects(ct.takeToken(""), (err) => err instanceof ValidationError && /argument pool/.test(err.message));
    await assert.rejects(
      ct.takeToken("login", { minRemaining: -1 }),
      (err) => err instanceof ValidationError && /options\.minRemaining/.test(err.message),
    );
  } finally {
    await ct.close();
  }
});

test("4 Node and 4 Python processes race for 30 tokens: 30 distinct taken, Node gets some", { skip, timeout: 120000 }, async () => {
  const p = prefix("race");
  const ct = client(p);
  try {
    await py(p, ["declare", "race"]);
    assert.equal(await py(p, ["fill", "race", "30", "r"]), 30);
    const ready = `${p}:test:ready`;
    const go = `${p}:test:go`;
    const env = { CAPTCHAAI_KEY_PREFIX: p };
    const racers = [
      ...Array.from({ length: 4 }, () => ({ lang: "node", run: nodeSpawn("taker.js", ["race", ready, go], env) })),
      ...Array.from({ length: 4 }, () => ({ lang: "python", run: pySpawn(p, ["race", "race", ready, go]) })),
    ];
    // Everybody connected and waiting, then one start for all.
    await waitFor(async () => Number(await ct.redis.get(ready)) === 8, "8 racers ready", 60000);
    await ct.redis.rpush(go, ...Array(8).fill("go"));
    // Each takes one first, whatever its start-up speed; then the race for the other 22.
    await waitFor(async () => Number(await ct.redis.get(`${ready}:first`)) === 8, "8 racers with one token", 60000);
    await ct.redis.rpush(`${go}:race`, ...Array(8).fill("go"));
    const results = await Promise.all(racers.map(async ({ lang, run }) => ({ lang, tokens: (await run.done).pop() })));
    const all = results.flatMap((r) => r.tokens);
    assert.equal(all.length, 30, "every token handed out");
    assert.equal(new Set(all).size, 30, "no token handed out twice");
    const byNode = results.filter((r) => r.lang === "node").flatMap((r) => r.tokens);
    assert.ok(byNode.length >= 4, "every Node racer took one at least");
    assert.equal(await ct.takeToken("race"), null);
  } finally {
    await ct.close();
  }
});
