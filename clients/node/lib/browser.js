"use strict";
// Cookies between the shared store and a browser, as Python's toolkit/sessions.py does:
// toPlaywright() gives BrowserContext.addCookies() entries, fromPlaywright() keeps the
// context.cookies() entries a browser would send to the domain.
const check = require("./check");
const { badArgument } = require("./errors");
const { withVersion } = require("./sessions");

/** Whether a browser sends a cookie of `cookieDomain` to host `domain`. */
function domainMatches(cookieDomain, domain) {
  const cookieHost = String(cookieDomain).trim().toLowerCase();
  const host = String(domain).trim().toLowerCase().replace(/^\.+/, "");
  if (!cookieHost || !host) return false;
  if (cookieHost.startsWith(".")) {
    const base = cookieHost.slice(1);
    return host === base || host.endsWith(`.${base}`);
  }
  return cookieHost === host;
}

/** Cookies in addCookies() format ({name, value, domain, path}). */
function toPlaywright(cookies, domain, path = "/") {
  const clean = check.cookies(cookies);
  check.nonEmptyString(domain, "domain");
  check.nonEmptyString(path, "path");
  return Object.entries(clean).map(([name, value]) => ({ name, value, domain, path }));
}

/** The context.cookies() entries that belong to `domain`, as {name: value} (version 0). */
function fromPlaywright(cookies, domain) {
  if (!Array.isArray(cookies)) throw badArgument("cookies", "an array of Playwright cookies");
  check.nonEmptyString(domain, "domain");
  const kept = {};
  cookies.forEach((cookie, index) => {
    if (!cookie || typeof cookie.name !== "string" || typeof cookie.value !== "string") {
      throw badArgument(`cookies[${index}]`, "a cookie with a string name and value");
    }
    if (domainMatches(cookie.domain || "", domain)) kept[cookie.name] = cookie.value;
  });
  return withVersion(kept, 0);
}

module.exports = { domainMatches, fromPlaywright, toPlaywright };
