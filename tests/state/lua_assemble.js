// The Lua scripts assembled without Python, as the format of captcha_tasks/state/lua says
// (what the Node.js package does): prints, for every script, its SHA1, its name and its
// keys in KEYS order (a list of keys as name*size).  Usage: node lua_assemble.js <root>
"use strict";
const fs = require("fs");
const path = require("path");
const crypto = require("crypto");

const root = process.argv[2];

function assemble(file, seen) {
  const lines = fs.readFileSync(path.join(root, file), "utf8").split(/(?<=\n)/);
  return lines
    .map((line) => {
      const include = /^--@include (\S+)\n$/.exec(line);
      if (!include) return line;
      if (seen.has(include[1])) return "";
      seen.add(include[1]);
      return assemble(include[1], seen);
    })
    .join("");
}

function keys(text) {
  const table = /^local K = \{\n([\s\S]*?)^\}\n/m.exec(text);
  if (!table) return [];
  const found = [];
  for (const line of table[1].split("\n")) {
    const entry = /^\s*([a-z][a-z0-9_]*) = (\{[^}]*\}|KEYS\[\d+\])/.exec(line);
    if (!entry) continue;
    const size = (entry[2].match(/KEYS\[/g) || []).length;
    found.push(entry[2].startsWith("{") ? `${entry[1]}*${size}` : entry[1]);
  }
  return found;
}

for (const dir of fs.readdirSync(root).sort()) {
  if (dir === "lib" || !fs.statSync(path.join(root, dir)).isDirectory()) continue;
  for (const file of fs.readdirSync(path.join(root, dir)).sort()) {
    if (!file.endsWith(".lua")) continue;
    const name = `${dir}/${file.slice(0, -4)}`;
    const source = assemble(`${name}.lua`, new Set([`${name}.lua`]));
    const sha = crypto.createHash("sha1").update(source, "utf8").digest("hex");
    console.log(`${sha}  ${name}  ${keys(source).join(",")}`);
  }
}
