"use strict";
// Proxy leases shared with Python's ProxyPool: one owner keeps its proxy, two owners
// never share one, a release frees it for the other language, a quarantined proxy is
// not leased.
const test = require("node:test");
const assert = require("node:assert/strict");
const { client, missing, prefix, py } = require("./helpers");

const skip = missing("REDIS_URL", "CT_PYTHON");

test("leases and releases agree with Python's ProxyPool", { skip }, async () => {
  const p = prefix("proxies");
  const ct = client(p);
  try {
    assert.equal(await py(p, ["proxies-add", "user:pw@10.0.0.1:8080", "10.0.0.2:8080"]), 2);
    const mine = await ct.proxies.lease("node-1");
    assert.ok(["user:pw@10.0.0.1:8080", "10.0.0.2:8080"].includes(mine));
    assert.equal(await ct.proxies.lease("node-1"), mine, "an owner keeps its proxy");
    assert.equal(await py(p, ["proxy-current", "node-1"]), mine);
    const theirs = await py(p, ["proxy-lease", "py-1"]);
    assert.ok(theirs && theirs !== mine, "Python gets the other one");
    assert.equal(await ct.proxies.lease("node-2"), null, "none free");
    assert.equal(await py(p, ["proxy-lease", "py-2"]), null);
    assert.equal(await ct.proxies.release("node-1"), true);
    assert.equal(await ct.proxies.release("node-1"), false);
    assert.equal(await py(p, ["proxy-lease", "py-2"]), mine, "freed for Python");
    assert.equal(await py(p, ["proxy-release", "py-1"]), true);
    await py(p, ["proxy-quarantine", theirs]);
    assert.equal(await ct.proxies.lease("node-2"), null, "a quarantined proxy is not leased");
    await assert.rejects(ct.proxies.lease("has space"), /argument owner/);
  } finally {
    await ct.close();
  }
});

test("more proxies than one call offers: each owner still gets a free one", { skip }, async () => {
  const p = prefix("proxies-many");
  const ct = client(p);
  try {
    const all = Array.from({ length: 20 }, (_, i) => `10.1.0.${i + 1}:3128`);
    assert.equal(await py(p, ["proxies-add", ...all]), 20);
    const leased = [];
    for (let i = 0; i < 20; i += 1) leased.push(await ct.proxies.lease(`owner-${i}`));
    assert.deepEqual([...leased].sort(), [...all].sort());
    assert.equal(await ct.proxies.lease("owner-20"), null);
  } finally {
    await ct.close();
  }
});
