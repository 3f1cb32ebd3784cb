"use strict";
// What the tests share: the Redis and key prefix they were given (REDIS_URL,
// CAPTCHAAI_KEY_PREFIX), the Python side (CT_PYTHON runs tests/node/py_side.py), and a
// wait for a state (never a sleep for synchronisation).
const { spawn, execFile } = require("node:child_process");
const crypto = require("node:crypto");
const path = require("node:path");
const { CaptchaTasks } = require("..");

const REPO = path.resolve(__dirname, "..", "..", "..");
const PY_SIDE = path.join(REPO, "tests", "node", "py_side.py");

/** Why a test cannot run here (no Redis or no Python side given), or false. */
function missing(...names) {
  const absent = names.filter((name) => !process.env[name]);
  return absent.length ? `set ${absent.join(", ")} (the pytest module tests/node sets them)` : false;
}

/** A key prefix of this test's own, under the one the run was given. */
function prefix(name) {
  return `${process.env.CAPTCHAAI_KEY_PREFIX || "ct-node"}-${name}-${crypto.randomBytes(3).toString("hex")}`;
}

function client(keyPrefix, redisUrl = process.env.REDIS_URL) {
  return new CaptchaTasks({ redisUrl, keyPrefix });
}

/** Run a py_side.py command against `keyPrefix`; its JSON answer. */
function py(keyPrefix, args, redisUrl = process.env.REDIS_URL) {
  const env = { ...process.env, REDIS_URL: redisUrl, CAPTCHAAI_KEY_PREFIX: keyPrefix };
  return new Promise((resolve, reject) => {
    execFile(process.env.CT_PYTHON, [PY_SIDE, ...args], { env, timeout: 60000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`py_side ${args[0]} failed: ${stderr.slice(-2000)}`));
      else resolve(JSON.parse(stdout.trim().split("\n").pop()));
    });
  });
}

/** A py_side.py command left running: its JSON lines as they come, and its end. */
function pySpawn(keyPrefix, args, redisUrl = process.env.REDIS_URL) {
  const env = { ...process.env, REDIS_URL: redisUrl, CAPTCHAAI_KEY_PREFIX: keyPrefix };
  const child = spawn(process.env.CT_PYTHON, [PY_SIDE, ...args], { env, stdio: ["pipe", "pipe", "inherit"] });
  return withLines(child);
}

/** A node script of test/fixtures left running, like pySpawn. */
function nodeSpawn(script, args, env) {
  const child = spawn(process.execPath, [path.join(__dirname, "fixtures", script), ...args], {
    env: { ...process.env, ...env },
    stdio: ["pipe", "pipe", "inherit"],
  });
  return withLines(child);
}

function withLines(child) {
  const lines = [];
  let buffered = "";
  child.stdout.on("data", (chunk) => {
    buffered += chunk;
    const parts = buffered.split("\n");
    buffered = parts.pop();
    for (const part of parts) if (part.trim()) lines.push(JSON.parse(part));
  });
  const done = new Promise((resolve, reject) => {
    child.on("exit", (code) => (code === 0 ? resolve(lines) : reject(new Error(`exit ${code}`))));
  });
  return { child, lines, done };
}

/** Poll `predicate` (may be async) until it is truthy, or fail after `timeoutMs`. */
async function waitFor(predicate, what, timeoutMs = 10000, intervalMs = 20) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

module.exports = { REPO, client, missing, nodeSpawn, prefix, py, pySpawn, waitFor };
