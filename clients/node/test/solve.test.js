"use strict";
// solve() over the 2captcha protocol, against the project's sandbox API (CT_GATEWAY_URL,
// CT_GATEWAY_KEY), which speaks it like the gateway; and the puppeteer-extra-plugin-
// recaptcha provider, which takes from a pool first.
const test = require("node:test");
const assert = require("node:assert/strict");
const { AuthError, BadRequestError, ValidationError, recaptchaProvider } = require("..");
const { client, missing, prefix, py } = require("./helpers");

const skip = missing("REDIS_URL", "CT_PYTHON", "CT_GATEWAY_URL", "CT_GATEWAY_KEY");
const PAGE = "https://shop.example/login";
const FAST = { firstPollS: 0.1, pollS: 0.1, timeoutS: 30 };

function gateway(extra = {}) {
  return { gateway: process.env.CT_GATEWAY_URL, key: process.env.CT_GATEWAY_KEY, ...FAST, ...extra };
}

test("solve() submits and polls until the token comes", { skip }, async () => {
  const ct = client(prefix("solve"));
  try {
    const solved = await ct.solve({ method: "turnstile", sitekey: "0x4AAA-node", pageurl: PAGE, lane: "interactive", tenant: "node" }, gateway());
    assert.equal(solved.status, "solved");
    assert.equal(solved.source, "api");
    assert.match(solved.captcha_id, /^\d+$/);
    assert.equal(typeof solved.token, "string");
    assert.ok(solved.token.length > 10);
    assert.equal(Object.keys(solved).pop(), "token", "the token last");
    const recaptcha = await ct.solve({ method: "userrecaptcha", sitekey: "6Lc-node", pageurl: PAGE }, gateway());
    assert.equal(recaptcha.method, "userrecaptcha");
  } finally {
    await ct.close();
  }
});

test("solve() errors are typed and never show the key", { skip }, async () => {
  const ct = client(prefix("solve-errors"));
  try {
    const wrongKey = "wrong-key-1234567890";
    await assert.rejects(ct.solve({ method: "turnstile", sitekey: "0x4AAA", pageurl: PAGE }, gateway({ key: wrongKey })), (err) => {
      assert.ok(err instanceof AuthError, err.name);
      assert.ok(!err.message.includes(wrongKey));
      return true;
    });
    await assert.rejects(ct.solve({ method: "turnstile", pageurl: PAGE }, gateway()), BadRequestError);
    await assert.rejects(ct.solve({ method: "turnstile", sitekey: "k", pageurl: PAGE }, gateway({ gateway: "ftp://x" })), /options\.gateway/);
    await assert.rejects(ct.solve({ method: "turnstile", sitekey: "k", pageurl: PAGE }, { gateway: process.env.CT_GATEWAY_URL }), ValidationError);
  } finally {
    await ct.close();
  }
});

test("the recaptcha plugin's provider takes from a pool first, else solves", { skip }, async () => {
  const p = prefix("provider");
  const ct = client(p);
  try {
    await py(p, ["declare", "login"]);
    await py(p, ["fill", "login", "1", "pooled"]);
    const provider = recaptchaProvider(ct, { ...gateway(), pool: (captcha) => (captcha.url === PAGE ? "login" : null) });
    assert.equal(provider.id, "captcha-tasks");
    const captcha = { _vendor: "recaptcha", id: "c1", sitekey: "6Lc-node", url: PAGE };
    const first = await provider.fn([captcha]);
    assert.equal(first.error, null);
    const [fromPool] = first.solutions;
    assert.equal(fromPool.text, "tok-pooled-0");
    assert.equal(fromPool.hasSolution, true);
    const {
      solutions: [solved, other],
    } = await provider.fn([captcha, { ...captcha, id: "c2", url: "https://other.example/" }]);
    for (const answer of [solved, other]) {
      assert.equal(answer.hasSolution, true, answer.error);
      assert.notEqual(answer.text, "tok-pooled-0");
    }
    const refused = await recaptchaProvider(ct, { ...gateway({ key: "wrong-key-0987654321" }) }).fn([captcha]);
    const [failed] = refused.solutions;
    assert.equal(refused.error, failed.error, "the plugin's result names the failure");
    assert.equal(failed.hasSolution, false);
    assert.match(failed.error, /ERROR_/);
    assert.ok(!failed.error.includes("wrong-key-0987654321"));
  } finally {
    await ct.close();
  }
});
