"use strict";
// captcha-tasks for Node.js: the Python package's Redis state (token pools, shared
// sessions, proxy leases) through its own Lua scripts, and solves through a gateway.
const { badArgument, ...errors } = require("./lib/errors");
const { CaptchaTasks } = require("./lib/client");
const { Keys } = require("./lib/keys");
const { Library } = require("./lib/scripts");
const { SessionLock, CookieStore } = require("./lib/sessions");
const { ProxyLeases, proxyId } = require("./lib/proxies");
const { domainMatches, fromPlaywright, toPlaywright } = require("./lib/browser");
const { recaptchaProvider } = require("./lib/recaptcha");
const { version } = require("./package.json");

module.exports = {
  CaptchaTasks,
  CookieStore,
  Keys,
  Library,
  ProxyLeases,
  SessionLock,
  domainMatches,
  fromPlaywright,
  proxyId,
  recaptchaProvider,
  toPlaywright,
  version,
  ...errors,
};
