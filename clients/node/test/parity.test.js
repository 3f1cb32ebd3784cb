"use strict";
// Node and Python agree on what they share: the Lua they run, the key names they build,
// the error tree, the version.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { Keys, Library, errorTree, version } = require("..");
const { defaultRoot } = require("../lib/scripts");
const { SCRIPTS, TAKE_HISTORY_S } = require("../lib/client");
const fence = require("../lib/fence");
const { REPO, missing, py } = require("./helpers");

const skip = missing("CT_PYTHON");

test("the scripts this package loads are the Python package's files, assembled alike", { skip }, async () => {
  const python = await py("unused", ["shas"]);
  const library = new Library();
  assert.equal(path.resolve(defaultRoot()), path.join(REPO, "captcha_tasks", "state", "lua"));
  assert.deepEqual(library.names(), Object.keys(python).sort());
  for (const name of library.names()) assert.equal(library.sha(name), python[name], name);
  for (const name of SCRIPTS) assert.ok(name in python, `${name} is a script of the Python package`);
});

test("key names are state/keys.py's, for any prefix", { skip }, async () => {
  const sample = { name: "login", domain: "shop.example", owner: "w-1", proxyId: "0123abcd" };
  for (const keyPrefix of ["captcha", "ct-x:tenant"]) {
    const python = await py("unused", ["keys", keyPrefix]);
    const keys = new Keys(keyPrefix);
    const node = {
      pool_registry: keys.poolRegistry(),
      pool_tokens: keys.poolTokens(sample.name),
      pool_stats: keys.poolStats(sample.name),
      pool_takes: keys.poolTakes(sample.name),
      cookies: keys.cookies(sample.domain),
      session_lock: keys.sessionLock(sample.domain),
      session_version: keys.sessionVersion(sample.domain),
      proxies: keys.proxies(),
      proxy_assignment: keys.proxyAssignment(sample.owner),
      proxy_owner: keys.proxyOwner(sample.proxyId),
      proxy_quarantine: keys.proxyQuarantine(),
    };
    assert.deepEqual(node, python);
  }
});

test("the error tree is errors.py's", { skip }, async () => {
  assert.deepEqual(errorTree(), await py("unused", ["errors"]));
});

test("the replica fence's numbers and the take history are Python's", { skip }, async () => {
  const python = await py("unused", ["constants"]);
  const node = {
    FOLLOW_S: fence.FOLLOW_S,
    MOVE_SETTLE_S: fence.MOVE_SETTLE_S,
    FENCE_WAIT_MS: fence.FENCE_WAIT_MS,
    SENTINEL_TIMEOUT_S: fence.SENTINEL_TIMEOUT_S,
    NOT_A_CANDIDATE: [...fence.NOT_A_CANDIDATE].sort(),
    WAIT: fence.ReplicaFence.waitCommand(),
    TAKE_HISTORY_S,
  };
  assert.deepEqual(node, python);
});

test("the package's version is the Python package's", () => {
  const pyproject = fs.readFileSync(path.join(REPO, "pyproject.toml"), "utf8");
  assert.equal(version, /^version = "([^"]+)"$/m.exec(pyproject)[1]);
});
