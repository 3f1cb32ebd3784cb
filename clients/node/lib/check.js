"use strict";
// Argument checks at the call site: each error names the argument, never its value.
const { badArgument } = require("./errors");

const DOMAIN = /^[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?$/;
const NAME = /^[A-Za-z0-9_.:-]{1,200}$/;

function nonEmptyString(value, name) {
  if (typeof value !== "string" || !value.trim()) throw badArgument(name, "a non-empty string");
  return value;
}

/** A lower-case host name without a leading dot (it becomes part of key names), as
 * Python's toolkit/sessions.py normalises it. */
function domain(value, name = "domain") {
  if (typeof value !== "string") throw badArgument(name, "a host name string");
  const host = value.trim().toLowerCase().replace(/^\.+/, "");
  if (!host || host.length > 253 || !DOMAIN.test(host)) throw badArgument(name, "a host name (like shop.example)");
  return host;
}

function poolName(value, name = "pool") {
  if (typeof value !== "string" || !NAME.test(value)) {
    throw badArgument(name, "a pool name (letters, digits, _ . : -)");
  }
  return value;
}

function positiveNumber(value, name) {
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
    throw badArgument(name, "a positive number");
  }
  return value;
}

function optionalPositive(value, name) {
  return value === undefined || value === null ? undefined : positiveNumber(value, name);
}

function nonNegative(value, name) {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) throw badArgument(name, "a number >= 0");
  return value;
}

function positiveInt(value, name) {
  if (!Number.isInteger(value) || value <= 0) throw badArgument(name, "a positive integer");
  return value;
}

/** A copy of a {name: value} object of cookies; errors name the cookie, never its value. */
function cookies(value, name = "cookies") {
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw badArgument(name, "an object of cookie name -> value");
  }
  const entries = Object.entries(value);
  if (!entries.length) throw badArgument(name, "at least one cookie (use clear() to drop a session)");
  const clean = {};
  for (const [key, item] of entries) {
    if (!key) throw badArgument(name, "an object whose cookie names are non-empty");
    if (typeof item !== "string") throw badArgument(`${name}.${key}`, "a string");
    clean[key] = item;
  }
  return clean;
}

function options(value, name) {
  if (value === undefined) return {};
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw badArgument(name, "an object");
  return value;
}

module.exports = {
  cookies,
  domain,
  nonEmptyString,
  nonNegative,
  optionalPositive,
  options,
  poolName,
  positiveInt,
  positiveNumber,
};
