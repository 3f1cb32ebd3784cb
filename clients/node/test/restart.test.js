"use strict";
// Redis restarts while Node takes: the takes that meet the outage fail with a typed
// StoreUnavailable (no password in it), the client reconnects by itself, and no token is
// lost or handed out twice (the server syncs its append-only file on every write).
const test = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const { StoreUnavailable } = require("..");
const { client, missing, prefix, py, waitFor } = require("./helpers");

const skip = missing("CT_PYTHON", "CT_REDIS_SERVER");
const TOKENS = 200;

function freePort() {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function startServer(port, dir) {
  const args = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", dir];
  const child = spawn(process.env.CT_REDIS_SERVER, args, { stdio: "ignore" });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  return { child, exited };
}

test("a Redis restart during takes gives StoreUnavailable and loses no token", { skip, timeout: 120000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "ct-node-restart-"));
  const port = await freePort();
  const url = `redis://:node-test-password@127.0.0.1:${port}/0`;
  let server = startServer(port, dir);
  const p = prefix("restart");
  // requirepass is set at run time: the URL's password then counts, and must never show.
  const admin = client(p, `redis://127.0.0.1:${port}/0`);
  await waitFor(() => admin.redis.ping().then(() => true, () => false), "the Redis server");
  await admin.redis.config("SET", "requirepass", "node-test-password");
  await admin.close();
  const ct = client(p, url);
  try {
    await py(p, ["declare", "outage"], url);
    assert.equal(await py(p, ["fill", "outage", String(TOKENS), "o"], url), TOKENS);
    const taken = [];
    const failures = [];
    let stopped = false;
    while (taken.length + failures.length < 10000) {
      if (taken.length === 50 && !stopped) {
        // Between two takes (one in flight as Redis stops may have run with its reply
        // lost: see the Node.js guide), then the takes go on into the outage.
        server.child.kill("SIGTERM");
        await server.exited;
        stopped = true;
      }
      let token;
      try {
        token = await ct.takeToken("outage");
      } catch (err) {
        failures.push(err);
        if (failures.length === 3) server = startServer(port, dir); // a few takes meet the outage
        continue;
      }
      if (token === null) break;
      taken.push(token.token);
    }
    assert.ok(failures.length > 0, "some takes met the outage");
    for (const err of failures) {
      assert.ok(err instanceof StoreUnavailable, `${err.name}: ${err.message}`);
      assert.equal(err.code, "ERROR_REDIS_UNAVAILABLE");
      assert.ok(!err.message.includes("node-test-password"), "the password stays out");
    }
    assert.equal(new Set(taken).size, taken.length, "no token twice");
    assert.equal(taken.length, TOKENS, "every token handed out once, none lost");
  } finally {
    await ct.close();
    server.child.kill("SIGKILL");
    await server.exited;
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
