"use strict";
// solve() through a gateway that speaks the 2captcha protocol (in.php / res.php, json=1):
// the captcha-tasks gateway, or the sandbox API.  "Not ready yet" is a value here
// (NOT_READY), never an error; every failure is one of the package's typed errors, and no
// message holds the key or a token.
const check = require("./check");
const errors = require("./errors");

const NOT_READY = Symbol("NOT_READY");
const DEFAULTS = { timeoutS: 180, pollS: 5, firstPollS: 5, requestTimeoutS: 30 };
/** The sitekey's parameter name in in.php, by method (2captcha's). */
const SITEKEY_PARAM = { userrecaptcha: "googlekey", hcaptcha: "sitekey", turnstile: "sitekey" };

function solveParams(task) {
  const t = check.options(task, "task");
  const method = check.nonEmptyString(t.method, "task.method");
  const params = { method };
  if (t.sitekey !== undefined) params[SITEKEY_PARAM[method] || "sitekey"] = check.nonEmptyString(t.sitekey, "task.sitekey");
  if (t.pageurl !== undefined) params.pageurl = check.nonEmptyString(t.pageurl, "task.pageurl");
  for (const name of ["lane", "tenant"]) {
    if (t[name] !== undefined) params[name] = check.nonEmptyString(t[name], `task.${name}`);
  }
  for (const [name, value] of Object.entries(t.params || {})) {
    if (typeof value !== "string" && typeof value !== "number") throw errors.badArgument(`task.params.${name}`, "a string or number");
    params[name] = String(value);
  }
  return params;
}

function gatewayOptions(options) {
  const o = check.options(options, "options");
  const gateway = check.nonEmptyString(o.gateway, "options.gateway");
  let url;
  try {
    url = new URL(gateway);
  } catch {
    throw errors.badArgument("options.gateway", "an http(s) URL");
  }
  if (!/^https?:$/.test(url.protocol)) throw errors.badArgument("options.gateway", "an http(s) URL");
  return {
    base: gateway.replace(/\/+$/, ""),
    key: check.nonEmptyString(o.key, "options.key"),
    timeoutS: o.timeoutS === undefined ? DEFAULTS.timeoutS : check.positiveNumber(o.timeoutS, "options.timeoutS"),
    pollS: o.pollS === undefined ? DEFAULTS.pollS : check.positiveNumber(o.pollS, "options.pollS"),
    firstPollS: o.firstPollS === undefined ? DEFAULTS.firstPollS : check.nonNegative(o.firstPollS, "options.firstPollS"),
  };
}

/** One reply of in.php / res.php as a value: {ok, request} or NOT_READY; errors thrown. */
function parseReply(status, body, captchaId) {
  if (status === 429) return { error: new errors.RateLimited("the gateway asks to slow down", null, captchaId) };
  if (status >= 500) return { error: new errors.TransportError(`the gateway answered HTTP ${status}`, null, captchaId) };
  let data;
  try {
    data = JSON.parse(body);
  } catch {
    return { error: new errors.TransportError(`the gateway answered HTTP ${status} without JSON`, null, captchaId) };
  }
  if (data.status === 1) return { ok: data.request };
  if (data.request === "CAPCHA_NOT_READY" || data.request === "CAPTCHA_NOT_READY") return NOT_READY;
  return { error: errors.fromApiCode(String(data.request || "ERROR_UNKNOWN"), captchaId) };
}

async function call(url, init, captchaId) {
  let response;
  try {
    response = await fetch(url, { ...init, signal: AbortSignal.timeout(DEFAULTS.requestTimeoutS * 1000) });
  } catch (err) {
    // The URL holds the key: the message names only what failed.
    throw new errors.TransportError(`the gateway did not answer (${err.name})`, null, captchaId);
  }
  const reply = parseReply(response.status, await response.text(), captchaId);
  if (reply !== NOT_READY && reply.error) throw reply.error;
  return reply;
}

function wait(seconds) {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

/** Submit the task and poll until it is solved: {status, token, captcha_id, method, ...}. */
async function solve(task, options) {
  const params = solveParams(task);
  const o = gatewayOptions(options);
  const started = Date.now();
  const body = new URLSearchParams({ ...params, key: o.key, json: "1" });
  const submitted = await call(`${o.base}/in.php`, { method: "POST", body }, null);
  const captchaId = String(submitted.ok);
  const deadline = started + o.timeoutS * 1000;
  await wait(o.firstPollS);
  for (;;) {
    const query = new URLSearchParams({ key: o.key, action: "get", id: captchaId, json: "1" });
    const reply = await call(`${o.base}/res.php?${query}`, { method: "GET" }, captchaId);
    if (reply !== NOT_READY) return outcome(reply.ok, captchaId, params.method, started);
    if (Date.now() + o.pollS * 1000 > deadline) {
      throw new errors.SolveTimeout(`not solved within ${o.timeoutS}s`, null, captchaId);
    }
    await wait(o.pollS); // the poll interval of the protocol, not a synchronisation
  }
}

function outcome(token, captchaId, method, started) {
  const now = Date.now();
  return {
    status: "solved",
    captcha_id: captchaId,
    method,
    source: "api",
    elapsed_s: Math.round(now - started) / 1000,
    solved_at: new Date(now).toISOString(),
    token, // last, as in every outcome: a truncated print shows the facts, not the secret
  };
}

module.exports = { solve, parseReply, solveParams, NOT_READY };
