"use strict";
// What needs no Redis: settings, argument checks, errors, browser cookie helpers and the
// gateway's reply parser.
const test = require("node:test");
const assert = require("node:assert/strict");
const ct = require("..");
const { redisOptions, maskUrl } = require("../lib/settings");
const { parseReply, solveParams, NOT_READY } = require("../lib/gateway");
const { candidate, replicaFence } = require("../lib/fence");

test("REDIS_URL and CAPTCHAAI_KEY_PREFIX are the defaults", async () => {
  const client = new ct.CaptchaTasks({ env: { REDIS_URL: "redis://127.0.0.1:1/3", CAPTCHAAI_KEY_PREFIX: "tenant-a" } });
  assert.equal(client.keys.prefix, "tenant-a");
  assert.equal(client.redisUrl, "redis://127.0.0.1:1/3");
  await client.close();
  const plain = new ct.CaptchaTasks({ env: {} });
  assert.equal(plain.keys.prefix, "captcha");
  await plain.close();
});

test("only a sentinel:// deployment has a replica fence; a replica down is no candidate", async () => {
  assert.equal(replicaFence("redis://127.0.0.1:1/0", {}), null);
  const fence = replicaFence("sentinel://127.0.0.1:1", { REDIS_SENTINEL_MASTER: "m" });
  try {
    assert.equal(await fence.needed(), true); // no sentinel answers: assume one could take over
  } finally {
    fence.close();
  }
  assert.equal(candidate({ flags: "slave" }), true);
  assert.equal(candidate({ flags: "slave,disconnected" }), true); // the one being promoted in a switch
  assert.equal(candidate({ flags: "slave,s_down" }), false);
  assert.equal(candidate({ flags: "slave,s_down,o_down,disconnected" }), false);
});

test("sentinel:// URLs are read as Python reads them", () => {
  const { sentinel } = redisOptions("sentinel://:pw@s1:26380/2;sentinel://s2", { REDIS_SENTINEL_MASTER: "mymaster" });
  assert.deepEqual(sentinel.sentinels, [
    { host: "s1", port: 26380 },
    { host: "s2", port: 26379 },
  ]);
  assert.equal(sentinel.name, "mymaster");
  assert.equal(sentinel.db, 2);
  assert.equal(sentinel.password, "pw");
  assert.throws(() => redisOptions("sentinel://s1", {}), /REDIS_SENTINEL_MASTER/);
  assert.throws(() => redisOptions("sentinel://u:p@s1", { REDIS_SENTINEL_MASTER: "m" }), /no user/);
  assert.throws(() => redisOptions("sentinel://:a@s1;sentinel://:b@s2", { REDIS_SENTINEL_MASTER: "m" }), /different passwords/);
  assert.equal(maskUrl("sentinel://:pw@s1;sentinel://:pw@s2"), "sentinel://:***@s1;sentinel://:***@s2");
});

test("every argument is checked where it is passed, the error naming it", () => {
  const bad = (fn, name) => assert.throws(fn, (err) => err instanceof ct.ValidationError && err.message.includes(name));
  bad(() => new ct.CaptchaTasks("redis://x"), "argument options");
  bad(() => new ct.CaptchaTasks({ redisUrl: 5 }), "options.redisUrl");
  bad(() => new ct.CaptchaTasks({ keyPrefix: "" }), "options.keyPrefix");
  bad(() => new ct.CaptchaTasks({ cookieTtl: -1 }), "argument ttl");
  const client = new ct.CaptchaTasks({ env: {} });
  bad(() => client.sessionLock("a b"), "argument domain");
  bad(() => client.sessionLock("shop.example", { ttlMs: 1.5 }), "ttlMs");
  bad(() => solveParams({ method: "turnstile", sitekey: "" }), "task.sitekey");
  bad(() => solveParams(null), "argument task");
  client.close();
});

test("errors mirror Python's tree and keep secrets out", () => {
  const err = ct.fromApiCode("ERROR_WRONG_USER_KEY", "123");
  assert.ok(err instanceof ct.AuthError && err instanceof ct.FatalError && err instanceof ct.CaptchaTasksError);
  assert.equal(err.code, "ERROR_WRONG_USER_KEY");
  assert.equal(err.captchaId, "123");
  assert.ok(ct.fromApiCode("ERROR_NEVER_SEEN") instanceof ct.UnknownAPIError);
  assert.ok(new ct.SessionBusy() instanceof ct.RetryableError);
  assert.equal(new ct.StoreUnavailable().name, "StoreUnavailable");
});

test("cookies to and from Playwright's shape, as the Python toolkit does", () => {
  const cookies = ct.toPlaywright({ sid: "1", lang: "en" }, "shop.example");
  assert.deepEqual(cookies, [
    { name: "sid", value: "1", domain: "shop.example", path: "/" },
    { name: "lang", value: "en", domain: "shop.example", path: "/" },
  ]);
  const back = ct.fromPlaywright(
    [...cookies, { name: "other", value: "x", domain: "elsewhere.example" }, { name: "wide", value: "w", domain: ".example" }],
    "shop.example",
  );
  assert.deepEqual({ ...back }, { sid: "1", lang: "en", wide: "w" }, "a domain cookie of .example goes to shop.example too");
  assert.equal(back.version, 0);
  assert.deepEqual({ ...ct.fromPlaywright([{ name: "wide", value: "w", domain: ".shop.example" }], "a.shop.example") }, { wide: "w" });
  assert.throws(() => ct.fromPlaywright([{ name: "n" }], "shop.example"), /cookies\[0\]/);
  assert.equal(ct.domainMatches("shop.example", "a.shop.example"), false);
});

test("gateway replies are values: a token, NOT_READY, or a typed error", () => {
  assert.deepEqual(parseReply(200, '{"status":1,"request":"42"}'), { ok: "42" });
  assert.equal(parseReply(200, '{"status":0,"request":"CAPCHA_NOT_READY"}'), NOT_READY);
  assert.ok(parseReply(200, '{"status":0,"request":"ERROR_ZERO_BALANCE"}').error instanceof ct.ZeroBalance);
  assert.ok(parseReply(502, "<html>").error instanceof ct.TransportError);
  assert.ok(parseReply(429, "").error instanceof ct.RateLimited);
  assert.ok(parseReply(200, "OK|abc").error instanceof ct.TransportError);
});
