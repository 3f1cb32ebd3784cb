"use strict";
// A solution provider for puppeteer-extra-plugin-recaptcha (its `provider: {id, fn}`
// hook): each captcha found on the page is answered from a token pool when one matches
// (`pools(captcha)` names it), else solved through the gateway.
const check = require("./check");
const { badArgument } = require("./errors");

const ID = "captcha-tasks";
/** The plugin's captcha vendors -> the 2captcha protocol's methods. */
const METHODS = { recaptcha: "userrecaptcha", hcaptcha: "hcaptcha" };

/** The provider object: `recaptchaProvider(ct, {gateway, key, pool, lane, tenant})`,
 * where `pool` is a pool name or a function (captcha) -> pool name or null. */
function recaptchaProvider(ct, options) {
  const o = check.options(options, "options");
  if (o.pool !== undefined && typeof o.pool !== "string" && typeof o.pool !== "function") {
    throw badArgument("options.pool", "a pool name or a function of the captcha");
  }
  // The plugin reads `{solutions, error}` back (its GetSolutionsResult), as from its
  // built-in 2captcha provider; `error` is the first failed captcha's message, or null.
  const fn = async (captchas) => {
    const solutions = await Promise.all(captchas.map((captcha) => solveOne(ct, o, captcha)));
    const failed = solutions.find((solution) => solution.error);
    return { solutions, error: failed ? failed.error : null };
  };
  return { id: ID, fn };
}

async function solveOne(ct, o, captcha) {
  const requestAt = new Date();
  const base = { _vendor: captcha._vendor, id: captcha.id, requestAt, provider: ID };
  try {
    const pool = typeof o.pool === "function" ? o.pool(captcha) : o.pool;
    const pooled = pool ? await ct.takeToken(pool) : null;
    const solved = pooled || (await ct.solve(task(o, captcha), { gateway: o.gateway, key: o.key }));
    return { ...base, text: solved.token, hasSolution: true, responseAt: new Date(), providerCaptchaId: solved.captcha_id };
  } catch (err) {
    // The plugin shows `error`: the typed error's message holds no secret.
    return { ...base, hasSolution: false, error: String(err.message || err), responseAt: new Date() };
  }
}

function task(o, captcha) {
  const method = METHODS[captcha._vendor] || captcha._vendor;
  const t = { method, sitekey: captcha.sitekey, pageurl: captcha.url };
  if (o.lane) t.lane = o.lane;
  if (o.tenant) t.tenant = o.tenant;
  const params = {};
  if (captcha.s) params["data-s"] = captcha.s;
  if (captcha.isInvisible) params.invisible = "1";
  if (captcha.isEnterprise) params.enterprise = "1";
  if (Object.keys(params).length) t.params = params;
  return t;
}

module.exports = { recaptchaProvider };
