"use strict";
// The Lua scripts of captcha_tasks/state/lua, assembled exactly as the Python package
// assembles them (see that folder's __init__.py): read the script file, replace each
// `--@include lib/<name>.lua` line with the fragment's assembled text (once per script,
// in the order first named).  Nothing else is substituted, so the SHA1 of the result is
// the one Python's `python -m captcha_tasks.state.lua` prints.
const fs = require("fs");
const path = require("path");
const crypto = require("crypto");

const INCLUDE = /^--@include (\S+)$/;
const FRAGMENT = /^lib\/[a-z][a-z0-9_]*\.lua$/;
const KEY = /^([a-z][a-z0-9_]*) = KEYS\[(\d+)\],?(?:\s+--.*)?$/;
const KEY_LIST = /^([a-z][a-z0-9_]*) = \{([^}]*)\},?(?:\s+--.*)?$/;

/** Where the scripts are: the copy `npm pack` ships (./lua), else the Python package's
 * folder of this repository's checkout. */
function defaultRoot() {
  const shipped = path.join(__dirname, "..", "lua");
  if (fs.existsSync(shipped)) return shipped;
  return path.join(__dirname, "..", "..", "..", "captcha_tasks", "state", "lua");
}

class ScriptFormatError extends Error {}

class Library {
  constructor(root = defaultRoot()) {
    this.root = root;
    this._sources = new Map();
  }

  text(file) {
    const found = path.join(this.root, file);
    if (!fs.existsSync(found)) throw new ScriptFormatError(`${file}: no such file under ${this.root}`);
    const text = fs.readFileSync(found, "utf8");
    if (!text.endsWith("\n") || text.includes("\r")) {
      throw new ScriptFormatError(`${file}: lines must end with LF, the last one too`);
    }
    return text;
  }

  /** Every script's name ("pools/take"), sorted; fragments (lib/) are not scripts. */
  names() {
    const names = [];
    for (const dir of fs.readdirSync(this.root)) {
      const full = path.join(this.root, dir);
      if (dir === "lib" || !fs.statSync(full).isDirectory()) continue;
      for (const file of fs.readdirSync(full)) {
        if (file.endsWith(".lua")) names.push(`${dir}/${file.slice(0, -4)}`);
      }
    }
    // Python sorts by code point: so does a plain comparison of strings.
    return names.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  }

  source(name) {
    if (!this._sources.has(name)) {
      this._sources.set(name, this._assemble(`${name}.lua`, new Set([`${name}.lua`])));
    }
    return this._sources.get(name);
  }

  _assemble(file, seen) {
    const lines = this.text(file).split(/(?<=\n)/);
    return lines
      .map((line, index) => {
        const include = INCLUDE.exec(line.replace(/\n$/, ""));
        if (!include) return line;
        if (!FRAGMENT.test(include[1])) {
          throw new ScriptFormatError(`${file}:${index + 1}: cannot include '${include[1]}'`);
        }
        if (seen.has(include[1])) return "";
        seen.add(include[1]);
        return this._assemble(include[1], seen);
      })
      .join("");
  }

  sha(name) {
    return crypto.createHash("sha1").update(this.source(name), "utf8").digest("hex");
  }

  /** The script's K table: [{name, index, size}] in KEYS order (size: a list of keys). */
  keys(name) {
    const lines = this.text(`${name}.lua`).split("\n");
    const start = lines.indexOf("local K = {");
    if (start < 0) return [];
    const keys = [];
    let expected = 1;
    for (const raw of lines.slice(start + 1)) {
      if (raw === "}") return keys;
      const line = raw.trim();
      if (!line || line.startsWith("--")) continue;
      const key = parseKey(name, line, expected);
      keys.push(key);
      expected += key.size || 1;
    }
    throw new ScriptFormatError(`${name}.lua: the K table has no closing line '}'`);
  }
}

function parseKey(name, line, expected) {
  const single = KEY.exec(line);
  if (single) {
    if (Number(single[2]) !== expected) {
      throw new ScriptFormatError(`${name}.lua: KEYS[${single[2]}], expected KEYS[${expected}]`);
    }
    return { name: single[1], index: expected, size: null };
  }
  const listed = KEY_LIST.exec(line);
  if (!listed) throw new ScriptFormatError(`${name}.lua: not a key entry: ${line}`);
  const size = listed[2].split(",").filter((item) => item.trim()).length;
  return { name: listed[1], index: expected, size };
}

/** The ioredis command name a script is registered under ("pools/take" -> "ct_pools_take"). */
function commandName(name) {
  return `ct_${name.replace(/\//g, "_")}`;
}

/** Register `names` on an ioredis client with defineCommand (EVALSHA, EVAL on NOSCRIPT);
 * returns run(name, keys, args): keys by name (a list of keys as an array of at most its
 * size), args one JSON object. */
function bind(redis, library, names) {
  const scripts = new Map();
  for (const name of names) {
    const keys = library.keys(name);
    const fixed = keys.some((key) => key.size) ? undefined : keys.length;
    redis.defineCommand(commandName(name), { numberOfKeys: fixed, lua: library.source(name) });
    scripts.set(name, { keys, fixed });
  }
  const run = (name, keys, args = {}) => {
    const script = scripts.get(name);
    if (!script) throw new ScriptFormatError(`script ${name} is not registered`);
    const values = keyValues(name, script.keys, keys);
    const argv = [...values, JSON.stringify(args)];
    const command = redis[commandName(name)].bind(redis);
    return script.fixed === undefined ? command(values.length, ...argv) : command(...argv);
  };
  /** The call's parts to queue by hand (EVALSHA sha ...argv, or EVAL source ...argv on
   * NOSCRIPT): for a pipeline whose next command must follow the script itself. */
  run.parts = (name, keys, args = {}) => {
    if (!scripts.has(name)) throw new ScriptFormatError(`script ${name} is not registered`);
    const values = keyValues(name, scripts.get(name).keys, keys);
    return { sha: library.sha(name), source: library.source(name), argv: [values.length, ...values, JSON.stringify(args)] };
  };
  return run;
}

function keyValues(name, order, keys) {
  const missing = order.filter((key) => !(key.name in keys)).map((key) => key.name);
  if (missing.length) throw new ScriptFormatError(`${name}: keys missing: ${missing.join(", ")}`);
  return order.flatMap((key) => {
    const value = keys[key.name];
    if (!key.size) {
      if (typeof value !== "string") throw new ScriptFormatError(`${name}: key ${key.name} is one key name`);
      return [value];
    }
    if (!Array.isArray(value) || value.length > key.size) {
      throw new ScriptFormatError(`${name}: key ${key.name} is a list of at most ${key.size} key names`);
    }
    return value;
  });
}

module.exports = { Library, ScriptFormatError, bind, commandName, defaultRoot };
